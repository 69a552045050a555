//! Print a small attention block in RLX's text form and as JSON (the serialized form that
//! `Graph::from_json` reads back and verifies).
//!
//! `cargo run -p rlx --example ir_dump [-- --json]`

use rlx::prelude::*;

fn main() {
    let mut g = Graph::new("attention_block");
    let x = g.input("x", Shape::new(&[1, 8, 32], DType::F32));
    let pos = g.input("pos", Shape::new(&[8], DType::I32));
    let wq = g.param("wq", Shape::new(&[32, 32], DType::F32));
    let gamma = g.param("gamma", Shape::new(&[32], DType::F32));
    let h = g.rms_norm(x, gamma, 1e-6);
    let q = g.dot(h, wq);
    let q = g.reshape(q, &[1, 8, 4, 8]);
    let q = g.transpose(q, &[0, 2, 1, 3]);
    let q = g.rope(q, pos, 10000.0, false);
    let a = g.attention(q, q, q, MaskKind::Causal, 8f32.powf(-0.5));
    let a = g.transpose(a, &[0, 2, 1, 3]);
    let a = g.reshape(a, &[1, 8, 32]);
    let y = g.add(a, x);
    g.set_outputs(vec![y]);
    if std::env::args().any(|a| a == "--json") {
        println!("{}", g.to_json());
    } else {
        println!("{g}");
    }
}
