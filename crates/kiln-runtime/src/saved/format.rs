//! The plan file's layout: the fixed header, the manifest (JSON through serde), checksums and
//! the dtype names the manifest and the safetensors block use. `docs/saved-plans.md` is the
//! format's description; this module is its one implementation, shared by the writer and the
//! reader.
//!
//! ```text
//! 0    8   "KILNPLAN"
//! 8    4   format version, u32 little-endian (1)
//! 12   4   zero
//! 16   8   manifest length M, u64 little-endian
//! 24   16  XXH3-128 of the manifest, little-endian
//! 40   24  zero
//! 64   M   manifest (UTF-8 JSON)
//! ...      kernel section (each kernel's IR text, back to back; located by the manifest)
//! ...      zero padding to a multiple of 4096
//! ...      constants: a safetensors file (located by the manifest), up to the file's end
//! ```

use serde::{Deserialize, Serialize};

use kiln_device::kiln_ir::Scalar;

/// The first eight bytes of every plan file.
pub const MAGIC: [u8; 8] = *b"KILNPLAN";

/// The format version this reader and writer know. A reader refuses every other version (see
/// `docs/saved-plans.md` for the rule).
pub const FORMAT_VERSION: u32 = 1;

/// The fixed header's size in bytes: the manifest starts here.
pub const HEADER_BYTES: usize = 64;

/// The constants block starts at a multiple of this (a page), so the CPU maps it in place and
/// every tensor in it is aligned to its element size.
pub const CONSTANTS_ALIGN: u64 = 4096;

/// The largest manifest a reader accepts (far above any real plan's: a manifest line per node
/// and buffer), so that a damaged length cannot make it allocate without bound.
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// The XXH3-128 of `bytes`, as the manifest writes checksums: 32 lowercase hex digits.
pub fn checksum(bytes: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes))
}

/// The header for a manifest of `manifest` bytes.
pub fn header(manifest: &[u8]) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&(manifest.len() as u64).to_le_bytes());
    h[24..40].copy_from_slice(&xxhash_rust::xxh3::xxh3_128(manifest).to_le_bytes());
    h
}

/// The fields of a header after its magic bytes and version (which a reader checks first,
/// on however many bytes the file has), read without judging them.
pub struct Header {
    /// Whether every reserved byte is zero.
    pub reserved_zero: bool,
    /// The manifest's length.
    pub manifest_len: u64,
    /// The manifest's checksum, as the manifest writes checksums.
    pub manifest_checksum: String,
}

impl Header {
    /// The header in `h`.
    pub fn read(h: &[u8; HEADER_BYTES]) -> Header {
        let take = |at: usize, n: usize| &h[at..at + n];
        let mut u64b = [0u8; 8];
        u64b.copy_from_slice(take(16, 8));
        let mut sum = [0u8; 16];
        sum.copy_from_slice(take(24, 16));
        Header {
            reserved_zero: take(12, 4).iter().chain(take(40, 24)).all(|&b| b == 0),
            manifest_len: u64::from_le_bytes(u64b),
            manifest_checksum: format!("{:032x}", u128::from_le_bytes(sum)),
        }
    }
}

/// Everything about a plan but its kernels' text and its constants' bytes.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// What wrote the file (`kiln-runtime 0.1.0`; informational).
    pub writer: String,
    /// The device the plan was recorded on (informational: a plan loads on any device).
    pub saved_on: String,
    /// The plan variables and the values they were recorded with.
    pub variables: Vec<VariableEntry>,
    /// The named inputs, each a window of a buffer.
    pub inputs: Vec<TensorEntry>,
    /// The named outputs.
    pub outputs: Vec<TensorEntry>,
    /// The plan's memory: one entry per allocation the plan uses.
    pub buffers: Vec<BufferEntry>,
    /// The kernels, each located in the kernel section.
    pub kernels: Vec<KernelEntry>,
    /// The nodes in recorded order.
    pub nodes: Vec<NodeEntry>,
    /// Where the kernels' text lies in the file.
    pub kernel_section: Section,
    /// Where the constants' safetensors block lies (length 0 when no buffer has bytes).
    pub constants: Section,
}

/// A plan variable.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VariableEntry {
    /// The name every kernel of the plan uses for it (`DEFINE_VAR`).
    pub name: String,
    /// The value it was recorded with: a run that does not bind it uses this.
    pub value: i64,
}

/// A named input or output.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorEntry {
    /// Its name, unique among the inputs (outputs).
    pub name: String,
    /// The window of a buffer that holds it (its dtype is the tensor's).
    pub view: ViewEntry,
    /// Its shape: element counts and plan variables, row-major.
    pub shape: Vec<Dim>,
}

/// A dimension of an input's or output's shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Dim {
    /// A fixed number of elements.
    Fixed(u64),
    /// As many elements as the plan variable of this name says in a run (a batch size, a
    /// sequence length).
    Var(String),
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Var(v) => f.write_str(v),
        }
    }
}

impl From<u64> for Dim {
    fn from(n: u64) -> Dim {
        Dim::Fixed(n)
    }
}

impl From<&str> for Dim {
    fn from(name: &str) -> Dim {
        Dim::Var(name.to_string())
    }
}

/// A typed window of one of the plan's buffers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewEntry {
    /// The buffer's index in [`Manifest::buffers`].
    pub buffer: usize,
    /// The window's start, in bytes from the buffer's start (a multiple of the dtype's size).
    pub offset: u64,
    /// The window's length in elements.
    pub len: u64,
    /// The element type (`f32`, `i64`, ...: kiln IR's names).
    pub dtype: String,
}

/// What a buffer holds when the plan is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// It holds an input: the caller fills it before each run.
    Input,
    /// It holds an output (and no input): the caller reads it after each run.
    Output,
    /// Its bytes are in the constants block (weights, and any state the plan reads before
    /// writing).
    Constant,
    /// Memory the plan writes before it reads it: it starts zeroed.
    Scratch,
}

/// One of the plan's allocations.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BufferEntry {
    /// Its size in bytes.
    pub bytes: u64,
    /// The element type the plan uses it as most (informational; views carry their own).
    pub dtype: String,
    /// What it holds at load.
    pub role: Role,
    /// The safetensors tensor with its starting bytes (the whole buffer, as `bytes / size`
    /// elements of `dtype`, or `bytes` `u8` elements), when the plan reads bytes of it that
    /// nothing wrote first; zero bytes otherwise.
    pub tensor: Option<String>,
}

/// A kernel in the kernel section.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelEntry {
    /// The entry-point name it was compiled under (and is compiled under again).
    pub name: String,
    /// Where its text starts, in bytes from the kernel section's start.
    pub offset: u64,
    /// Its text's length in bytes.
    pub bytes: u64,
    /// The XXH3-128 of its text.
    pub checksum: String,
}

/// A node of the plan.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum NodeEntry {
    /// A launch of `kernel` over one window per parameter slot; its variables are the plan
    /// variables of the same names.
    Exec {
        /// Index in [`Manifest::kernels`].
        kernel: usize,
        /// One window per parameter slot.
        args: Vec<ViewEntry>,
    },
    /// A copy of `src` into `dst` (same byte size, not overlapping).
    Copy {
        /// The window written.
        dst: ViewEntry,
        /// The window read.
        src: ViewEntry,
    },
}

/// A byte range of the file, with the checksum of its bytes (the kernel section's parts carry
/// their own, so its own is empty).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Section {
    /// Its start, in bytes from the file's start.
    pub offset: u64,
    /// Its length in bytes.
    pub bytes: u64,
    /// The XXH3-128 of its bytes (empty for the kernel section).
    pub checksum: String,
}

/// The safetensors dtype of a kiln scalar (every kiln scalar has one).
pub fn tensor_dtype(s: Scalar) -> safetensors::Dtype {
    use safetensors::Dtype as D;
    match s {
        Scalar::Bool => D::BOOL,
        Scalar::I8 => D::I8,
        Scalar::I16 => D::I16,
        Scalar::I32 => D::I32,
        Scalar::I64 => D::I64,
        Scalar::U8 => D::U8,
        Scalar::U16 => D::U16,
        Scalar::U32 => D::U32,
        Scalar::U64 => D::U64,
        Scalar::F16 => D::F16,
        Scalar::BF16 => D::BF16,
        Scalar::F32 => D::F32,
        Scalar::F64 => D::F64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_what_was_written() {
        let bytes = header(b"{}");
        assert_eq!(bytes[..8], MAGIC);
        assert_eq!(bytes[8..12], FORMAT_VERSION.to_le_bytes());
        let h = Header::read(&bytes);
        assert!(h.reserved_zero);
        assert_eq!(h.manifest_len, 2);
        assert_eq!(h.manifest_checksum, checksum(b"{}"));
    }

    #[test]
    fn dims_are_numbers_or_names_in_json() {
        let dims = vec![Dim::from("batch"), Dim::from(16)];
        let text = serde_json::to_string(&dims).unwrap();
        assert_eq!(text, r#"["batch",16]"#);
        assert_eq!(serde_json::from_str::<Vec<Dim>>(&text).unwrap(), dims);
    }

    #[test]
    fn every_scalar_has_a_tensor_dtype_of_its_size() {
        for s in Scalar::ALL {
            assert_eq!(tensor_dtype(s).bitsize(), 8 * s.size(), "{s}");
        }
    }
}
