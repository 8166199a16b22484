//! A small reader and writer of NumPy `.npy` files, enough to move kernel inputs and
//! outputs in and out of the command line.
//!
//! Supported: format versions 1.0, 2.0 and 3.0; little-endian (or byte-order-free) element
//! types `<f2 <f4 <f8 <i1..<i8 <u1..<u8 |b1`; C order. Everything else (big-endian data,
//! Fortran order, structured or object dtypes, truncated data) is a [`NpyError`] that says
//! what the file holds and what would be accepted. Reading never panics on any input.

use std::fmt;

use kiln_ir::Scalar;

const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// What is wrong with a `.npy` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NpyError(pub String);

impl fmt::Display for NpyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NpyError {}

fn err<T>(msg: impl Into<String>) -> Result<T, NpyError> {
    Err(NpyError(msg.into()))
}

/// An array read from or about to be written to a `.npy` file: element type, shape and the
/// raw little-endian element bytes in C order.
#[derive(Debug, Clone, PartialEq)]
pub struct NpyArray {
    pub scalar: Scalar,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl NpyArray {
    /// A one-dimensional array over `data` (whose length must be a multiple of the element size).
    pub fn from_bytes(scalar: Scalar, data: Vec<u8>) -> Result<NpyArray, NpyError> {
        if !data.len().is_multiple_of(scalar.size()) {
            return err(format!("{} bytes are not a whole number of {scalar} elements", data.len()));
        }
        Ok(NpyArray { scalar, shape: vec![data.len() / scalar.size()], data })
    }

    /// Total number of elements (the product of the shape; 1 for a 0-d array).
    pub fn len(&self) -> usize {
        self.data.len() / self.scalar.size()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The shape as NumPy prints it: `(3,)`, `(2, 4)`, `()`.
    pub fn shape_text(&self) -> String {
        shape_text(&self.shape)
    }
}

fn shape_text(shape: &[usize]) -> String {
    match shape {
        [] => "()".into(),
        [n] => format!("({n},)"),
        dims => format!("({})", dims.iter().map(usize::to_string).collect::<Vec<_>>().join(", ")),
    }
}

/// The NumPy type string (`descr`) of a scalar, or `None` when NumPy has no such type (bf16).
pub fn descr(scalar: Scalar) -> Option<&'static str> {
    Some(match scalar {
        Scalar::Bool => "|b1",
        Scalar::I8 => "|i1",
        Scalar::U8 => "|u1",
        Scalar::I16 => "<i2",
        Scalar::I32 => "<i4",
        Scalar::I64 => "<i8",
        Scalar::U16 => "<u2",
        Scalar::U32 => "<u4",
        Scalar::U64 => "<u8",
        Scalar::F16 => "<f2",
        Scalar::F32 => "<f4",
        Scalar::F64 => "<f8",
        Scalar::BF16 => return None,
    })
}

/// The scalar of a NumPy type string. Byte order `<` (little), `|` (not applicable) and `=`
/// (native, which is little-endian on every machine kiln runs on) are accepted.
fn scalar_of(descr: &str) -> Result<Scalar, NpyError> {
    let supported = "supported: <f2 <f4 <f8 <i1 <i2 <i4 <i8 <u1 <u2 <u4 <u8 |b1";
    let mut chars = descr.chars();
    let order = chars.next().unwrap_or(' ');
    let code = chars.as_str();
    let scalar = match code {
        "b1" => Scalar::Bool,
        "i1" => Scalar::I8,
        "i2" => Scalar::I16,
        "i4" => Scalar::I32,
        "i8" => Scalar::I64,
        "u1" => Scalar::U8,
        "u2" => Scalar::U16,
        "u4" => Scalar::U32,
        "u8" => Scalar::U64,
        "f2" => Scalar::F16,
        "f4" => Scalar::F32,
        "f8" => Scalar::F64,
        _ => return err(format!("unsupported dtype '{descr}' ({supported})")),
    };
    match order {
        '<' | '=' => Ok(scalar),
        '|' if scalar.size() == 1 => Ok(scalar),
        '>' if scalar.size() == 1 => Ok(scalar),
        '>' => err(format!("big-endian dtype '{descr}' is not supported; save the array as '<{code}'")),
        _ => err(format!("unsupported dtype '{descr}' ({supported})")),
    }
}

/// Parses the bytes of a `.npy` file.
pub fn read(bytes: &[u8]) -> Result<NpyArray, NpyError> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return err("not a .npy file (it does not start with \\x93NUMPY)");
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (header_len, header_start) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 => {
            let Some(len) = bytes.get(8..12) else {
                return err("truncated .npy header");
            };
            (u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize, 12)
        }
        _ => return err(format!("unsupported .npy format version {major}.{minor} (supported: 1.0, 2.0, 3.0)")),
    };
    let data_start = header_start
        .checked_add(header_len)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| NpyError(format!("truncated .npy header: it claims {header_len} bytes")))?;
    let header = std::str::from_utf8(&bytes[header_start..data_start])
        .map_err(|_| NpyError("the .npy header is not valid text".into()))?;
    let Header { descr, fortran_order, shape } = parse_header(header)?;
    let scalar = scalar_of(&descr)?;
    if fortran_order {
        return err("Fortran-order arrays are not supported; save a C-order array (numpy.ascontiguousarray)");
    }
    let count = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| NpyError(format!("shape {} overflows", shape_text(&shape))))?;
    let want =
        count.checked_mul(scalar.size()).ok_or_else(|| NpyError(format!("shape {} overflows", shape_text(&shape))))?;
    let data = &bytes[data_start..];
    if data.len() != want {
        return err(format!(
            "the header says {} elements of '{descr}' ({want} bytes) but the file has {} data bytes",
            count,
            data.len()
        ));
    }
    Ok(NpyArray { scalar, shape, data: data.to_vec() })
}

/// The bytes of a `.npy` file holding `array` (version 1.0 unless the header needs 2.0).
pub fn write(array: &NpyArray) -> Result<Vec<u8>, NpyError> {
    let Some(descr) = descr(array.scalar) else {
        return err(format!("{} has no NumPy dtype and cannot be saved as .npy", array.scalar));
    };
    let count = array.shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if count != Some(array.len()) || !array.data.len().is_multiple_of(array.scalar.size()) {
        return err(format!(
            "shape {} does not match {} bytes of {}",
            array.shape_text(),
            array.data.len(),
            array.scalar
        ));
    }
    let dict = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {}, }}", array.shape_text());
    // Pad with spaces and end with '\n' so the data starts at a multiple of 64 bytes.
    let pad_to = |prefix: usize| {
        let unpadded = prefix + dict.len() + 1;
        dict.len() + 1 + (64 - unpadded % 64) % 64
    };
    let (version, header_len) = if pad_to(10) <= u16::MAX as usize { (1u8, pad_to(10)) } else { (2u8, pad_to(12)) };
    let mut out = Vec::with_capacity(12 + header_len + array.data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(header_len as u16).to_le_bytes());
    } else {
        let len = u32::try_from(header_len).map_err(|_| NpyError("the .npy header is too long".into()))?;
        out.extend_from_slice(&len.to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(out.len() + header_len - dict.len() - 1, b' ');
    out.push(b'\n');
    out.extend_from_slice(&array.data);
    Ok(out)
}

struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// Parses the header dict: `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`.
///
/// Strict and flat on purpose: each key exactly once, only the three keys NumPy writes, a
/// shape of integers (no nesting, so no recursion: a header of millions of parentheses is
/// refused at the second one), and nothing but padding after the closing brace.
fn parse_header(text: &str) -> Result<Header, NpyError> {
    let mut p = HeaderParser { s: text.trim_end_matches(['\n', ' ', '\0']).as_bytes(), pos: 0 };
    p.skip_ws();
    p.expect(b'{')?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            break;
        }
        let key = p.string().map_err(|_| NpyError("malformed .npy header: dictionary keys must be strings".into()))?;
        p.skip_ws();
        p.expect(b':')?;
        p.skip_ws();
        let taken = match key.as_str() {
            "descr" => descr.is_some(),
            "fortran_order" => fortran.is_some(),
            "shape" => shape.is_some(),
            k => {
                return err(format!(
                    "malformed .npy header: unexpected key '{k}' (expected 'descr', 'fortran_order' and 'shape')"
                ));
            }
        };
        if taken {
            return err(format!("malformed .npy header: key '{key}' appears twice"));
        }
        match key.as_str() {
            "descr" => {
                let d = p.string().map_err(|_| {
                    NpyError("unsupported dtype: structured arrays are not supported (descr is not a string)".into())
                })?;
                descr = Some(d);
            }
            "fortran_order" => fortran = Some(p.boolean()?),
            _ => shape = Some(p.shape()?),
        }
        p.skip_ws();
        if !p.eat(b',') {
            p.skip_ws();
            p.expect(b'}')?;
            break;
        }
    }
    p.skip_ws();
    if p.pos != p.s.len() {
        return err(format!("malformed .npy header: unexpected text after the dictionary at byte {}", p.pos));
    }
    match (descr, fortran, shape) {
        (Some(descr), Some(fortran_order), Some(shape)) => Ok(Header { descr, fortran_order, shape }),
        _ => err("malformed .npy header: it needs 'descr', 'fortran_order' and 'shape'"),
    }
}

/// A cursor over the header's bytes; every method reads one flat token.
struct HeaderParser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl HeaderParser<'_> {
    fn skip_ws(&mut self) {
        while self.s.get(self.pos).is_some_and(u8::is_ascii_whitespace) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        if self.s.get(self.pos) == Some(&c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), NpyError> {
        if self.eat(c) {
            Ok(())
        } else {
            err(format!("malformed .npy header: expected '{}' at byte {}", c as char, self.pos))
        }
    }

    fn unexpected<T>(&self, wanted: &str) -> Result<T, NpyError> {
        err(format!("malformed .npy header: unexpected text at byte {} (expected {wanted})", self.pos))
    }

    /// A quoted string, `'...'` or `"..."`.
    fn string(&mut self) -> Result<String, NpyError> {
        let Some(&q @ (b'\'' | b'"')) = self.s.get(self.pos) else {
            return self.unexpected("a quoted string");
        };
        self.pos += 1;
        let start = self.pos;
        while self.s.get(self.pos).is_some_and(|&c| c != q) {
            self.pos += 1;
        }
        let text = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
        self.expect(q)?;
        Ok(text)
    }

    fn boolean(&mut self) -> Result<bool, NpyError> {
        for (word, v) in [("True", true), ("False", false)] {
            if self.s[self.pos..].starts_with(word.as_bytes()) {
                self.pos += word.len();
                return Ok(v);
            }
        }
        self.unexpected("True or False")
    }

    /// A tuple (or list) of non-negative integers: `()`, `(3,)`, `(2, 3)`, `[2, 3]`.
    fn shape(&mut self) -> Result<Vec<usize>, NpyError> {
        let close = match self.s.get(self.pos) {
            Some(b'(') => b')',
            Some(b'[') => b']',
            _ => return self.unexpected("a tuple of integers for 'shape'"),
        };
        self.pos += 1;
        let mut dims = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(close) {
                return Ok(dims);
            }
            dims.push(self.dimension()?);
            self.skip_ws();
            if !self.eat(b',') {
                self.skip_ws();
                self.expect(close)?;
                return Ok(dims);
            }
        }
    }

    /// One shape entry: decimal digits, with the `L` that Python 2 era writers append to longs.
    fn dimension(&mut self) -> Result<usize, NpyError> {
        let start = self.pos;
        while self.s.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
        if start == self.pos {
            return err(format!("malformed .npy header: shape entries must be integers (byte {start})"));
        }
        let digits = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("");
        self.eat(b'L');
        digits.parse().map_err(|_| NpyError(format!("malformed .npy header: dimension {digits} is too large")))
    }
}

/// Element `i` of little-endian `data` of `scalar`, as text (floats with `{}` formatting).
pub fn element_text(scalar: Scalar, data: &[u8], i: usize) -> String {
    let size = scalar.size();
    let Some(b) = data.get(i * size..(i + 1) * size) else {
        return "?".into();
    };
    let mut a = [0u8; 8];
    a[..size].copy_from_slice(b);
    let u = u64::from_le_bytes(a);
    match scalar {
        Scalar::Bool => (u != 0).to_string(),
        Scalar::I8 => (u as u8 as i8).to_string(),
        Scalar::I16 => (u as u16 as i16).to_string(),
        Scalar::I32 => (u as u32 as i32).to_string(),
        Scalar::I64 => (u as i64).to_string(),
        Scalar::U8 | Scalar::U16 | Scalar::U32 | Scalar::U64 => u.to_string(),
        Scalar::F16 => format!("{:?}", half::f16::from_bits(u as u16).to_f32()),
        Scalar::BF16 => format!("{:?}", half::bf16::from_bits(u as u16).to_f32()),
        Scalar::F32 => format!("{:?}", f32::from_bits(u as u32)),
        Scalar::F64 => format!("{:?}", f64::from_bits(u)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exactly what `numpy.save` writes for `np.arange(3, dtype='<f4')`.
    fn numpy_f32_arange3() -> Vec<u8> {
        let mut v = b"\x93NUMPY\x01\x00\x76\x00".to_vec();
        let dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
        v.extend_from_slice(dict.as_bytes());
        v.resize(10 + 0x76 - 1, b' ');
        v.push(b'\n');
        for x in [0f32, 1.0, 2.0] {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v
    }

    #[test]
    fn reads_what_numpy_writes() {
        let a = read(&numpy_f32_arange3()).unwrap();
        assert_eq!(a.scalar, Scalar::F32);
        assert_eq!(a.shape, vec![3]);
        assert_eq!(a.len(), 3);
        assert_eq!(element_text(a.scalar, &a.data, 2), "2.0");
    }

    #[test]
    fn writes_what_numpy_writes() {
        let a = NpyArray::from_bytes(Scalar::F32, [0f32, 1.0, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect());
        assert_eq!(write(&a.unwrap()).unwrap(), numpy_f32_arange3());
    }

    #[test]
    fn round_trips_every_dtype_and_shape() {
        for s in Scalar::ALL {
            if s == Scalar::BF16 {
                continue;
            }
            for shape in [vec![], vec![0], vec![5], vec![2, 3], vec![1, 2, 2]] {
                let n: usize = shape.iter().product();
                let data: Vec<u8> = (0..n * s.size()).map(|i| i as u8).collect();
                let a = NpyArray { scalar: s, shape: shape.clone(), data };
                let bytes = write(&a).unwrap();
                assert_eq!(bytes.len() % 64, (n * s.size()) % 64, "data starts 64-aligned");
                assert_eq!(read(&bytes).unwrap(), a, "{s} {shape:?}");
            }
        }
    }

    #[test]
    fn reads_version_2_and_other_spellings() {
        let dict = b"{\"shape\": [2, 2], \"fortran_order\": False, \"descr\": \"|u1\"}\n";
        let mut v = b"\x93NUMPY\x02\x00".to_vec();
        v.extend_from_slice(&(dict.len() as u32).to_le_bytes());
        v.extend_from_slice(dict);
        v.extend_from_slice(&[1, 2, 3, 4]);
        let a = read(&v).unwrap();
        assert_eq!((a.scalar, a.shape.clone(), a.data.clone()), (Scalar::U8, vec![2, 2], vec![1, 2, 3, 4]));
    }

    fn with_header(dict: &str, data: &[u8]) -> Vec<u8> {
        let mut v = b"\x93NUMPY\x01\x00".to_vec();
        v.extend_from_slice(&(dict.len() as u16).to_le_bytes());
        v.extend_from_slice(dict.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn rejects_what_it_cannot_represent() {
        let cases: &[(Vec<u8>, &str)] = &[
            (b"hello world".to_vec(), "not a .npy file"),
            (b"\x93NUMPY\x01\x00\xff\x00{".to_vec(), "truncated"),
            (with_header("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", &[0; 4]), "big-endian"),
            (with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }", &[0; 4]), "Fortran"),
            (with_header("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", &[0; 8]), "unsupported dtype"),
            (with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", &[0; 4]), "data bytes"),
            (with_header("{'descr': '<f4', 'shape': (1,), }", &[0; 4]), "needs"),
            (with_header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", &[0; 4]), "structured"),
            (
                with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", &[]),
                "overflows",
            ),
            (with_header("{'descr': '<f4', 'fortran_order': Nope, 'shape': (1,), }", &[0; 4]), "unexpected text"),
            (with_header("{'descr': '<f4', 'fortran_order': False, 'shape': ((1,),), }", &[0; 4]), "integers"),
            (with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", &[0; 4]), "key 'x'"),
            (b"\x93NUMPY\x09\x00\x00\x00".to_vec(), "version 9.0"),
        ];
        for (bytes, want) in cases {
            let e = read(bytes).unwrap_err();
            assert!(e.0.contains(want), "expected `{want}` in `{e}`");
        }
        // Arbitrary truncations of a valid file never panic.
        let good = numpy_f32_arange3();
        for n in 0..good.len() {
            assert!(read(&good[..n]).is_err());
        }
        assert!(write(&NpyArray { scalar: Scalar::BF16, shape: vec![1], data: vec![0, 0] }).is_err());
    }

    #[test]
    fn a_deeply_nested_header_is_refused_without_recursing() {
        // Ten million nested parentheses: a recursive parser overflows any thread's stack.
        let depth = 10_000_000;
        let dict = format!(
            "{{'descr': '<f4', 'fortran_order': False, 'shape': {}1{}, }}",
            "(".repeat(depth),
            ")".repeat(depth)
        );
        let mut v = b"\x93NUMPY\x02\x00".to_vec();
        v.extend_from_slice(&(dict.len() as u32).to_le_bytes());
        v.extend_from_slice(dict.as_bytes());
        // A small stack makes the test independent of the test harness's thread size.
        let reader = std::thread::Builder::new().stack_size(64 << 10).spawn(move || read(&v)).unwrap();
        let e = reader.join().expect("the reader must not overflow its stack").unwrap_err();
        assert!(e.0.contains("shape entries must be integers"), "{e}");
    }

    #[test]
    fn duplicate_keys_and_trailing_text_are_refused() {
        let shape1 = "'fortran_order': False, 'shape': (1,)";
        let cases = [
            (format!("{{'descr': '<f4', {shape1}, 'descr': '<i4'}}"), "key 'descr' appears twice"),
            (format!("{{'descr': '<f4', {shape1}, 'shape': (1,)}}"), "key 'shape' appears twice"),
            (format!("{{'descr': '<f4', {shape1}, 'fortran_order': True}}"), "key 'fortran_order' appears twice"),
            (format!("{{'descr': '<f4', {shape1}}} garbage"), "unexpected text after the dictionary"),
            (format!("{{'descr': '<f4', {shape1}}}}}"), "unexpected text after the dictionary"),
        ];
        for (dict, want) in cases {
            let e = read(&with_header(&dict, &[0; 4])).unwrap_err();
            assert!(e.0.contains(want), "expected `{want}` in `{e}` for {dict}");
        }
        // Padding after the dictionary is what NumPy writes and stays accepted.
        assert!(read(&with_header(&format!("{{'descr': '<f4', {shape1}}}   \n"), &[0; 4])).is_ok());
    }

    #[test]
    fn half_precision_elements_show_their_exact_value() {
        let text = |s, bits: u16| element_text(s, &bits.to_le_bytes(), 0);
        assert_eq!(text(Scalar::F16, 0xc000), "-2.0");
        assert_eq!(text(Scalar::F16, 0x7bff), "65504.0");
        assert_eq!(text(Scalar::F16, 0x0001), format!("{:?}", 2f32.powi(-24)));
        assert_eq!(text(Scalar::F16, 0x7e00), "NaN");
        assert_eq!(text(Scalar::F16, 0xfc00), "-inf");
        assert_eq!(text(Scalar::BF16, 0x3f80), "1.0");
        assert_eq!(text(Scalar::BF16, 0xff80), "-inf");
    }
}
