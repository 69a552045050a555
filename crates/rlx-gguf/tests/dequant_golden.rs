//! Dequantization is bit-exact with the `gguf` Python package (`tests/golden/gen_dequant.py`
//! writes `dequant.json`; `scripts/regen-llm-goldens.sh` regenerates it).

use rlx_gguf::{dequantize, dequantize_portable, GgmlType};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn every_block_type_matches_the_gguf_package_bit_for_bit() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/dequant.json"
    ))
    .expect("golden file");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let mut seen = Vec::new();
    for case in v["cases"].as_array().expect("cases") {
        let name = case["type"].as_str().expect("type");
        let ty = GgmlType::all()
            .find(|t| t.to_string() == name)
            .unwrap_or_else(|| panic!("unknown type {name}"));
        let data = unhex(case["data_hex"].as_str().expect("hex"));
        let want: Vec<u32> = case["values_bits"]
            .as_array()
            .expect("bits")
            .iter()
            .map(|b| b.as_u64().expect("u32") as u32)
            .collect();
        // The SIMD decoder (where the CPU has AVX2) and the portable one, each against the golden.
        for (path, decode) in [
            ("simd", dequantize as fn(_, &_, &mut _) -> _),
            ("portable", dequantize_portable),
        ] {
            let mut got = vec![0f32; want.len()];
            decode(ty, &data, &mut got).unwrap_or_else(|e| panic!("{name}: {e}"));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let w = f32::from_bits(*w);
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
                    "{name} ({path}) element {i}: got {g} ({:#x}), want {w} ({:#x})",
                    g.to_bits(),
                    w.to_bits()
                );
            }
        }
        seen.push(ty);
    }
    for ty in GgmlType::all().filter(|t| t.can_dequantize() && *t != GgmlType::F64) {
        assert!(seen.contains(&ty), "no golden case for {ty}");
    }
}

#[test]
fn wrong_lengths_and_unsupported_types_are_errors() {
    let mut out = vec![0f32; 32];
    let e = dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out).unwrap_err();
    assert!(e.to_string().contains("17 bytes of Q4_0"), "{e}");
    let e = dequantize(GgmlType::IQ2_XXS, &[0u8; 66], &mut vec![0f32; 256]).unwrap_err();
    assert!(e.to_string().contains("IQ2_XXS is not supported"), "{e}");
}
