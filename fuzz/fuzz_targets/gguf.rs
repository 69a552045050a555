//! Fuzz the GGUF reader: any bytes must parse cleanly or give an error, never panic or read out
//! of bounds; every tensor of a file that parses must dequantize or fail cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlx_gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else { return };
    let _ = f.describe();
    for t in f.tensors() {
        if t.numel() <= 1 << 20 {
            let _ = f.dequantize_tensor(t);
        }
    }
    for e in f.metadata() {
        let _ = (f.get_usize(&e.key), f.get_str(&e.key), f.get_f32(&e.key), f.get_array(&e.key));
    }
});
