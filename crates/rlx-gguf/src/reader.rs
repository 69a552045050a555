//! The GGUF container: header, typed metadata, tensor table and data section.
//!
//! Parsing works on a byte slice and checks every length against what is left before reading,
//! so a truncated or hostile file yields a [`GgufError`] naming the offset and field — never a
//! panic, an out-of-bounds read or a huge allocation.

use crate::error::{GgufError, Result};
use crate::types::GgmlType;
use std::collections::HashMap;
use std::path::Path;

/// `"GGUF"` read as a little-endian u32.
const MAGIC: u32 = 0x4655_4747;
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;
/// Arrays nest at most this deep (the format allows nesting; real files use one level).
const MAX_DEPTH: usize = 8;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `UINT8`
    U8(u8),
    /// `INT8`
    I8(i8),
    /// `UINT16`
    U16(u16),
    /// `INT16`
    I16(i16),
    /// `UINT32`
    U32(u32),
    /// `INT32`
    I32(i32),
    /// `UINT64`
    U64(u64),
    /// `INT64`
    I64(i64),
    /// `FLOAT32`
    F32(f32),
    /// `FLOAT64`
    F64(f64),
    /// `BOOL`
    Bool(bool),
    /// `STRING` (invalid UTF-8 is replaced, as the spec requires UTF-8)
    String(String),
    /// `ARRAY`
    Array(Vec<Value>),
}

impl Value {
    /// The GGUF type name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "UINT8",
            Value::I8(_) => "INT8",
            Value::U16(_) => "UINT16",
            Value::I16(_) => "INT16",
            Value::U32(_) => "UINT32",
            Value::I32(_) => "INT32",
            Value::U64(_) => "UINT64",
            Value::I64(_) => "INT64",
            Value::F32(_) => "FLOAT32",
            Value::F64(_) => "FLOAT64",
            Value::Bool(_) => "BOOL",
            Value::String(_) => "STRING",
            Value::Array(_) => "ARRAY",
        }
    }

    /// Any integer value as `i128` (so every integer type converts losslessly).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A float or integer value as `f64`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One metadata entry.
#[derive(Clone, Debug, PartialEq)]
pub struct MetadataEntry {
    /// Key, e.g. `general.architecture`.
    pub key: String,
    /// Value.
    pub value: Value,
    /// File offset of the value (for error messages).
    pub offset: u64,
}

/// One row of the tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name.
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the contiguous (row) dimension.
    pub dims: Vec<u64>,
    /// Storage type.
    pub ty: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Dimensions in row-major (numpy) order: the last one is contiguous.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// Everything before the data section.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    /// Format version (1, 2 or 3).
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<MetadataEntry>,
    /// Tensor table in file order.
    pub tensors: Vec<TensorInfo>,
    /// Data alignment.
    pub alignment: u64,
    /// File offset of the data section.
    pub data_offset: u64,
}

/// A bounds-checked little-endian cursor.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    version: u32,
}

impl<'a> Cursor<'a> {
    fn err(&self, field: &str, msg: impl Into<String>) -> GgufError {
        GgufError::new(self.pos as u64, field, msg)
    }

    fn take(&mut self, n: u64, field: &str) -> Result<&'a [u8]> {
        let left = (self.buf.len() - self.pos) as u64;
        if n > left {
            return Err(self.err(
                field,
                format!("needs {n} bytes but the file ends after {left}"),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N]> {
        let s = self.take(N as u64, field)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, field: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// A count or length: u32 in GGUF v1, u64 later.
    fn size(&mut self, field: &str) -> Result<u64> {
        if self.version == 1 {
            self.u32(field).map(u64::from)
        } else {
            self.u64(field)
        }
    }

    fn string(&mut self, field: &str) -> Result<String> {
        let start = self.pos as u64;
        let n = self.size(field)?;
        let bytes = self.take(n, field).map_err(|mut e| {
            e.offset = start;
            e.msg = format!("string of {n} bytes runs past the end of the file");
            e
        })?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, ty: u32, field: &str, depth: usize) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>(field)?[0]),
            1 => Value::I8(self.array::<1>(field)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            4 => Value::U32(self.u32(field)?),
            5 => Value::I32(i32::from_le_bytes(self.array(field)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            7 => {
                let b = self.array::<1>(field)?[0];
                if b > 1 {
                    return Err(GgufError::new(
                        self.pos as u64 - 1,
                        field,
                        format!("BOOL must be 0 or 1, got {b}"),
                    ));
                }
                Value::Bool(b == 1)
            }
            8 => Value::String(self.string(field)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(self.err(
                        field,
                        format!("arrays nested deeper than {MAX_DEPTH} levels"),
                    ));
                }
                let ety = self.u32(field)?;
                let at = self.pos as u64;
                let n = self.size(field)?;
                // Every element takes at least one byte, so a count beyond the bytes left is a lie;
                // checking first keeps a hostile count from reserving memory.
                let left = (self.buf.len() - self.pos) as u64;
                if n > left {
                    return Err(GgufError::new(
                        at,
                        field,
                        format!("array claims {n} elements but only {left} bytes remain"),
                    ));
                }
                let mut items = Vec::with_capacity(n as usize);
                for i in 0..n {
                    // The element's name is only built for an error (a vocabulary has hundreds
                    // of thousands of elements): `field[i]` followed by what the element added.
                    let item = self.value(ety, field, depth + 1).map_err(|mut e| {
                        let inner = e.field.strip_prefix(field).unwrap_or("");
                        e.field = format!("{field}[{i}]{inner}");
                        e
                    })?;
                    items.push(item);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(field)?),
            11 => Value::I64(i64::from_le_bytes(self.array(field)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(field)?)),
            t => {
                return Err(GgufError::new(
                    self.pos as u64 - 4,
                    field,
                    format!("unknown metadata value type {t}"),
                ))
            }
        })
    }
}

/// Parse the header and tensor table of a GGUF file held in `buf`, checking that every tensor
/// lies inside the data section.
pub fn parse_header(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor {
        buf,
        pos: 0,
        version: 3,
    };
    let magic = c.u32("magic")?;
    if magic != MAGIC {
        return Err(GgufError::new(
            0,
            "magic",
            format!("expected \"GGUF\", found {:?}", &buf[..4]),
        ));
    }
    let version = c.u32("version")?;
    if !(1..=3).contains(&version) {
        return Err(GgufError::new(
            4,
            "version",
            format!("unsupported GGUF version {version} (RLX reads 1, 2 and 3)"),
        ));
    }
    c.version = version;
    let n_tensors = c.size("tensor_count")?;
    let n_kv = c.size("metadata_kv_count")?;
    let mut metadata = Vec::new();
    let mut alignment = DEFAULT_ALIGNMENT;
    for i in 0..n_kv {
        let key = c.string(&format!("metadata[{i}].key"))?;
        let field = format!("metadata[\"{key}\"]");
        let ty = c.u32(&field)?;
        let offset = c.pos as u64;
        let value = c.value(ty, &field, 0)?;
        if key == "general.alignment" {
            alignment = match value {
                Value::U32(a) if a.is_power_of_two() => a.into(),
                ref v => {
                    return Err(GgufError::new(
                        offset,
                        field,
                        format!("must be a power-of-two UINT32, got {v:?}"),
                    ))
                }
            };
        }
        metadata.push(MetadataEntry { key, value, offset });
    }
    let mut tensors: Vec<TensorInfo> = Vec::new();
    let mut names = HashMap::new();
    for i in 0..n_tensors {
        let name = c.string(&format!("tensor_info[{i}].name"))?;
        let field = format!("tensor_info[{i}] (\"{name}\")");
        if names.insert(name.clone(), i).is_some() {
            return Err(c.err(&field, "duplicate tensor name"));
        }
        let at = c.pos as u64;
        let n_dims = c.u32(&format!("{field}.n_dims"))?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::new(
                at,
                format!("{field}.n_dims"),
                format!("{n_dims} dimensions (ggml allows at most {MAX_DIMS})"),
            ));
        }
        let mut dims = Vec::new();
        for _ in 0..n_dims {
            dims.push(c.size(&format!("{field}.dims"))?);
        }
        let at = c.pos as u64;
        let tid = c.u32(&format!("{field}.type"))?;
        let ty = GgmlType::from_id(tid).ok_or_else(|| {
            GgufError::new(
                at,
                format!("{field}.type"),
                format!("unknown ggml type id {tid}"),
            )
        })?;
        let at = c.pos as u64;
        let offset = c.u64(&format!("{field}.offset"))?;
        if offset % alignment != 0 {
            return Err(GgufError::new(
                at,
                format!("{field}.offset"),
                format!("offset {offset} is not a multiple of the alignment {alignment}"),
            ));
        }
        let numel = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let size = numel.and_then(|n| {
            let (be, bb) = (ty.block_elems() as u64, ty.block_bytes() as u64);
            let row = dims.first().copied().unwrap_or(1);
            (row % be == 0).then(|| (n / be).checked_mul(bb)).flatten()
        });
        let size = size.ok_or_else(|| {
            GgufError::new(
                at,
                format!("{field}.dims"),
                format!(
                    "dims {dims:?} do not form whole {ty} blocks of {} elements (or overflow)",
                    ty.block_elems()
                ),
            )
        })?;
        tensors.push(TensorInfo {
            name,
            dims,
            ty,
            offset,
            size,
        });
    }
    let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
    if !tensors.is_empty() && data_offset > buf.len() as u64 {
        return Err(GgufError::new(
            c.pos as u64,
            "data section",
            format!("the data section would start at {data_offset} (aligned to {alignment}) but the file ends at {}", buf.len()),
        ));
    }
    let data_len = (buf.len() as u64).saturating_sub(data_offset);
    for (i, t) in tensors.iter().enumerate() {
        if t.offset
            .checked_add(t.size)
            .is_none_or(|end| end > data_len)
        {
            return Err(GgufError::new(
                data_offset.saturating_add(t.offset),
                format!("tensor_info[{i}] (\"{}\").offset", t.name),
                format!(
                    "{} bytes of data at {} run past the end of the file ({data_len} data bytes)",
                    t.size, t.offset
                ),
            ));
        }
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

enum Source {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

/// An open GGUF file: its parsed header over the memory-mapped (or owned) bytes.
pub struct GgufFile {
    source: Source,
    header: Header,
    index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

impl GgufFile {
    /// Memory-map and parse the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let io = |e: std::io::Error| GgufError::new(0, "file", format!("{}: {e}", path.display()));
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; like every mmap reader we rely on the file not being
        // truncated underneath us while it is open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        GgufFile::with_source(Source::Mmap(map))
    }

    /// Parse a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        GgufFile::with_source(Source::Owned(bytes))
    }

    fn with_source(source: Source) -> Result<GgufFile> {
        let bytes: &[u8] = match &source {
            Source::Mmap(m) => m,
            Source::Owned(v) => v,
        };
        let header = parse_header(bytes)?;
        let index = header
            .metadata
            .iter()
            .enumerate()
            .map(|(i, e)| (e.key.clone(), i))
            .collect();
        let tensor_index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            source,
            header,
            index,
            tensor_index,
        })
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        match &self.source {
            Source::Mmap(m) => m,
            Source::Owned(v) => v,
        }
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Metadata entries in file order.
    pub fn metadata(&self) -> &[MetadataEntry] {
        &self.header.metadata
    }

    /// The tensor table.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The metadata entry for `key`.
    pub fn entry(&self, key: &str) -> Option<&MetadataEntry> {
        self.index.get(key).map(|&i| &self.header.metadata[i])
    }

    /// The metadata value for `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entry(key).map(|e| &e.value)
    }

    fn require(&self, key: &str) -> Result<&MetadataEntry> {
        self.entry(key).ok_or_else(|| {
            GgufError::new(0, format!("metadata[\"{key}\"]"), "required key is missing")
        })
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        want: &str,
        f: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<T> {
        let e = self.require(key)?;
        f(&e.value).ok_or_else(|| {
            GgufError::new(
                e.offset,
                format!("metadata[\"{key}\"]"),
                format!("expected {want}, found {}", e.value.type_name()),
            )
        })
    }

    /// A required non-negative integer that fits `usize`.
    pub fn get_usize(&self, key: &str) -> Result<usize> {
        self.typed(key, "a non-negative integer", |v| {
            v.as_int().and_then(|i| usize::try_from(i).ok())
        })
    }

    /// A required number as `f32`.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.typed(key, "a number", |v| v.as_f64().map(|x| x as f32))
    }

    /// A required string.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.typed(key, "a string", |v| v.as_str())
    }

    /// A required array.
    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        self.typed(key, "an array", |v| v.as_array())
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.header.tensors[i])
    }

    /// The tensor called `name`, or an error saying it is missing.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| {
            GgufError::new(
                0,
                format!("tensor \"{name}\""),
                "required tensor is missing from the file",
            )
        })
    }

    /// The stored bytes of a tensor (bounds were checked when the file was opened).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.header.data_offset + t.offset) as usize;
        &self.bytes()[start..start + t.size as usize]
    }

    /// A tensor decoded to f32 (row-major, [`TensorInfo::shape`]).
    pub fn dequantize_tensor(&self, t: &TensorInfo) -> Result<Vec<f32>> {
        let mut out = vec![0f32; t.numel() as usize];
        crate::dequantize(t.ty, self.tensor_data(t), &mut out).map_err(|mut e| {
            e.offset += self.header.data_offset + t.offset;
            e.field = format!("tensor \"{}\"", t.name);
            e
        })?;
        Ok(out)
    }

    /// Tell the OS the bytes of `t` will not be read again soon, so their pages can leave
    /// memory (used after copying weights out of the map). A no-op for in-memory files.
    pub fn release(&self, t: &TensorInfo) {
        self.release_range(t, 0, t.size);
    }

    /// [`GgufFile::release`] for bytes `offset..offset + len` of tensor `t`'s data.
    #[cfg_attr(not(unix), allow(unused_variables))]
    pub fn release_range(&self, t: &TensorInfo, offset: u64, len: u64) {
        #[cfg(unix)]
        if let Source::Mmap(m) = &self.source {
            let start = (self.header.data_offset + t.offset + offset.min(t.size)) as usize;
            let len = len.min(t.size - offset.min(t.size)) as usize;
            // Whole pages covering the range: they are file-backed and read-only, so dropping a
            // neighbour's boundary page only costs a re-read. Failures only mean the pages stay
            // resident.
            let page = 4096;
            let s = start / page * page;
            let e = (start + len).div_ceil(page) * page;
            let e = e.min(m.len());
            if e > s {
                // SAFETY: the map is a read-only file mapping, so dropped pages are re-read from
                // the file on the next access; no data is lost.
                let _ = unsafe {
                    m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, s, e - s)
                };
            }
        }
    }
}

impl std::fmt::Display for Value {
    /// Scalars as they are; strings quoted; arrays show their length and first few items.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::String(s) if s.chars().count() > 80 => {
                write!(f, "{:?}…", s.chars().take(80).collect::<String>())
            }
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(a) => {
                write!(f, "[{} items: ", a.len())?;
                for (i, v) in a.iter().take(6).enumerate() {
                    write!(f, "{}{v}", if i > 0 { ", " } else { "" })?;
                }
                f.write_str(if a.len() > 6 { ", …]" } else { "]" })
            }
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
        }
    }
}

impl GgufFile {
    /// A human-readable report: version, metadata and the tensor table (what `rlx inspect` prints).
    pub fn describe(&self) -> String {
        use std::fmt::Write;
        let h = &self.header;
        let mut s = String::new();
        let total: u64 = h.tensors.iter().map(|t| t.size).sum();
        let _ = writeln!(
            s,
            "GGUF v{}, {} metadata entries, {} tensors ({:.1} MiB of data, alignment {})",
            h.version,
            h.metadata.len(),
            h.tensors.len(),
            total as f64 / (1 << 20) as f64,
            h.alignment
        );
        let _ = writeln!(s, "\nmetadata:");
        for e in &h.metadata {
            let _ = writeln!(s, "  {:<44} {:<8} {}", e.key, e.value.type_name(), e.value);
        }
        let _ = writeln!(s, "\ntensors:");
        let _ = writeln!(
            s,
            "  {:<40} {:<8} {:>22} {:>12}",
            "name", "type", "shape", "bytes"
        );
        for t in &h.tensors {
            let _ = writeln!(
                s,
                "  {:<40} {:<8} {:>22} {:>12}",
                t.name,
                t.ty.to_string(),
                format!("{:?}", t.shape()),
                t.size
            );
        }
        s
    }
}
