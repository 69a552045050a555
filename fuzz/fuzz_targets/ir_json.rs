//! Fuzz the IR reader: any byte string must give a verified graph or an error, never a panic,
//! and every graph it accepts must print and round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(g) = rlx_ir::Graph::from_json(text) {
        let _ = g.to_string();
        let again = rlx_ir::Graph::from_json(&g.to_json()).expect("a verified graph re-reads");
        assert_eq!(again, g);
    }
});
