//! Print a GGUF file's metadata and tensor table: `cargo run -p rlx-gguf --example gguf_inspect -- FILE`.
fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: gguf_inspect FILE.gguf");
        std::process::exit(2);
    };
    match rlx_gguf::GgufFile::open(&path) {
        Ok(f) => print!("{}", f.describe()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
