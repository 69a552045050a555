//! The reader on hand-built files: every value type, versions 1–3, alignment, and hostile
//! input (truncation at every byte, bad counts, out-of-range tensors) giving errors that name
//! the offset and field.

use rlx_gguf::{parse_header, GgmlType, GgufFile, Value};

/// A minimal GGUF writer for tests.
struct W {
    b: Vec<u8>,
    v1: bool,
}

impl W {
    fn size(&mut self, n: u64) {
        if self.v1 {
            self.b.extend((n as u32).to_le_bytes());
        } else {
            self.b.extend(n.to_le_bytes());
        }
    }
    fn str(&mut self, s: &str) {
        self.size(s.len() as u64);
        self.b.extend(s.as_bytes());
    }
    fn kv(&mut self, k: &str, ty: u32, val: &[u8]) {
        self.str(k);
        self.b.extend(ty.to_le_bytes());
        self.b.extend(val);
    }
}

/// The start of a version-3 file with no tensors and one metadata entry, up to its key.
fn one_entry_v3(key: &str) -> W {
    let mut w = W {
        b: Vec::new(),
        v1: false,
    };
    w.b.extend(b"GGUF");
    w.b.extend(3u32.to_le_bytes());
    w.size(0);
    w.size(1);
    w.str(key);
    w
}

/// A file with one metadata entry of every type and two tensors (F32 [2,3] and Q8_0 [32]).
fn sample(version: u32) -> Vec<u8> {
    let mut w = W {
        b: Vec::new(),
        v1: version == 1,
    };
    w.b.extend(b"GGUF");
    w.b.extend(version.to_le_bytes());
    w.size(2);
    w.size(14);
    w.kv("u8", 0, &[7]);
    w.kv("i8", 1, &[0xFF]);
    w.kv("u16", 2, &500u16.to_le_bytes());
    w.kv("i16", 3, &(-5i16).to_le_bytes());
    w.kv("u32", 4, &70000u32.to_le_bytes());
    w.kv("i32", 5, &(-70000i32).to_le_bytes());
    w.kv("f32", 6, &1.5f32.to_le_bytes());
    w.kv("bool", 7, &[1]);
    let mut s = W {
        b: Vec::new(),
        v1: version == 1,
    };
    s.str("héllo");
    w.kv("str", 8, &s.b);
    let mut a = W {
        b: Vec::new(),
        v1: version == 1,
    };
    a.b.extend(4u32.to_le_bytes());
    a.size(3);
    for x in [1u32, 2, 3] {
        a.b.extend(x.to_le_bytes());
    }
    w.kv("arr", 9, &a.b);
    w.kv("u64", 10, &u64::MAX.to_le_bytes());
    w.kv("i64", 11, &i64::MIN.to_le_bytes());
    w.kv("f64", 12, &0.25f64.to_le_bytes());
    w.kv("general.alignment", 4, &64u32.to_le_bytes());
    // Tensors: "a" F32 dims [3, 2] (ggml order) at 0, "q" Q8_0 [32] at 64.
    w.str("a");
    w.b.extend(2u32.to_le_bytes());
    w.size(3);
    w.size(2);
    w.b.extend(0u32.to_le_bytes());
    w.b.extend(0u64.to_le_bytes());
    w.str("q");
    w.b.extend(1u32.to_le_bytes());
    w.size(32);
    w.b.extend(8u32.to_le_bytes());
    w.b.extend(64u64.to_le_bytes());
    while !w.b.len().is_multiple_of(64) {
        w.b.push(0);
    }
    for i in 0..6 {
        w.b.extend((i as f32).to_le_bytes());
    }
    w.b.resize(w.b.len() + 40, 0);
    // Q8_0 block: d = 0.5 (f16 0x3800), quants 0..32.
    w.b.extend(0x3800u16.to_le_bytes());
    w.b.extend((0..32).map(|i| i as u8));
    w.b
}

#[test]
fn reads_every_value_type_in_every_version() {
    for version in 1..=3 {
        let f = GgufFile::from_bytes(sample(version)).unwrap_or_else(|e| panic!("v{version}: {e}"));
        assert_eq!(f.header().version, version);
        assert_eq!(f.get("u8"), Some(&Value::U8(7)));
        assert_eq!(f.get("i8"), Some(&Value::I8(-1)));
        assert_eq!(f.get("i16"), Some(&Value::I16(-5)));
        assert_eq!(f.get("u64"), Some(&Value::U64(u64::MAX)));
        assert_eq!(f.get("i64"), Some(&Value::I64(i64::MIN)));
        assert_eq!(f.get_usize("u32").unwrap(), 70000);
        assert_eq!(f.get_f32("f64").unwrap(), 0.25);
        assert_eq!(f.get_str("str").unwrap(), "héllo");
        assert_eq!(
            f.get_array("arr").unwrap(),
            &[Value::U32(1), Value::U32(2), Value::U32(3)]
        );
        assert_eq!(f.header().alignment, 64);
        let a = f.tensor("a").unwrap();
        assert_eq!((a.shape(), a.ty, a.size), (vec![2, 3], GgmlType::F32, 24));
        assert_eq!(
            f.dequantize_tensor(a).unwrap(),
            vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        );
        let q = f.tensor("q").unwrap();
        let want: Vec<f32> = (0..32).map(|i| i as f32 * 0.5).collect();
        assert_eq!(f.dequantize_tensor(q).unwrap(), want);
        assert!(f
            .describe()
            .contains("q                                        Q8_0"));
    }
}

#[test]
fn type_errors_name_the_key_and_offset() {
    let f = GgufFile::from_bytes(sample(3)).unwrap();
    let e = f.get_str("u8").unwrap_err();
    assert!(
        e.field.contains("\"u8\"")
            && e.msg.contains("expected a string, found UINT8")
            && e.offset > 0,
        "{e}"
    );
    let e = f.get_usize("i8").unwrap_err();
    assert!(e.msg.contains("non-negative"), "{e}");
    assert!(f
        .get_usize("missing")
        .unwrap_err()
        .to_string()
        .contains("required key is missing"));
}

#[test]
fn every_truncation_is_an_error_never_a_panic() {
    let full = sample(3);
    for n in 0..full.len() - 1 {
        let r = parse_header(&full[..n]);
        // Cutting inside the data section is caught by the tensor bounds check.
        assert!(
            r.is_err(),
            "a file cut at {n} of {} bytes was accepted",
            full.len()
        );
    }
}

#[test]
fn hostile_headers_are_rejected_with_offsets() {
    let mut bad_magic = sample(3);
    bad_magic[0] = b'X';
    assert!(parse_header(&bad_magic)
        .unwrap_err()
        .to_string()
        .contains("magic"));
    let mut bad_version = sample(3);
    bad_version[4] = 9;
    assert!(parse_header(&bad_version)
        .unwrap_err()
        .to_string()
        .contains("unsupported GGUF version 9"));
    // A huge tensor count with no data behind it.
    let mut huge = sample(3);
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(parse_header(&huge).is_err());
    // An array claiming 2^60 elements must not try to allocate them.
    let mut w = one_entry_v3("arr");
    w.b.extend(9u32.to_le_bytes());
    w.b.extend(0u32.to_le_bytes());
    w.size(1 << 60);
    let e = parse_header(&w.b).unwrap_err();
    assert!(e.msg.contains("claims") && e.offset == 43, "{e}");
    // A tensor past the end of the file.
    let mut past = sample(3);
    let len = past.len();
    past.truncate(len - 10);
    let e = parse_header(&past).unwrap_err();
    assert!(
        e.field.contains("\"q\"") && e.msg.contains("run past the end"),
        "{e}"
    );
}

#[test]
fn a_data_section_past_the_end_is_an_error() {
    // Found by the `gguf` fuzz target: a zero-size tensor whose aligned data section starts
    // beyond the end of a 63-byte file.
    let bytes = include_bytes!("../../../fuzz/seeds/gguf/regression-data-offset-past-end.gguf");
    let e = GgufFile::from_bytes(bytes.to_vec()).unwrap_err();
    assert!(
        e.field == "data section" && e.msg.contains("file ends at 63"),
        "{e}"
    );
}

#[test]
fn an_error_inside_nested_arrays_names_each_index() {
    // metadata["arr"] = [[true], [false, true, 2]]: the 2 is not a BOOL.
    let mut w = one_entry_v3("arr");
    w.b.extend(9u32.to_le_bytes()); // ARRAY of
    w.b.extend(9u32.to_le_bytes()); // ARRAY
    w.size(2);
    w.b.extend(7u32.to_le_bytes()); // of BOOL
    w.size(1);
    w.b.push(1);
    w.b.extend(7u32.to_le_bytes());
    w.size(3);
    w.b.extend([0, 1, 2]);
    let e = parse_header(&w.b).unwrap_err();
    assert_eq!(e.field, "metadata[\"arr\"][1][2]", "{e}");
    assert!(
        e.msg.contains("BOOL must be 0 or 1, got 2") && e.offset == w.b.len() as u64 - 1,
        "{e}"
    );
}
