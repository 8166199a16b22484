//! The kernel text format: one node per line, SSA names, exact round trip.
//!
//! [`print`] writes any graph; [`parse`] reads it back into the *same* `Arc` (nodes are
//! hash-consed, so an exact round trip is pointer equality). [`parse_kernel`] also runs
//! [`crate::validate`] and [`crate::linearize`] and reports their findings at the line that
//! defines the offending node.
//!
//! # Example
//!
//! ```text
//! # kiln kernel v1
//! # c[i] = a[i] + b[i] for i < n
//! %n   = DEFINE_VAR i32 "n" 1 16777216
//! %a   = PARAM ptr<f32> 0 (%n)
//! %b   = PARAM ptr<f32> 1 (%n)
//! %c   = PARAM ptr<f32> 2 (%n)
//! %i   = SPECIAL i32 "idx0" (%n)
//! %pa  = INDEX ptr<f32> (%a, %i)
//! %pb  = INDEX ptr<f32> (%b, %i)
//! %pc  = INDEX ptr<f32> (%c, %i)
//! %x   = LOAD f32 (%pa)
//! %y   = LOAD f32 (%pb)
//! %sum = ADD f32 (%x, %y)
//! %st  = STORE void (%pc, %sum)
//! SINK void (%st)
//! ```
//!
//! # Lines
//!
//! Each non-blank line defines one node:
//!
//! ```text
//! %name = OP dtype [arg] [(%src, %src, ...)]     # comment
//! ```
//!
//! - `%name` is `%` followed by letters, digits, `_` or `.` (`%0`, `%sum`, `%acc_1`). A name
//!   is defined once and only used on later lines (no forward references).
//! - `OP` is the upper-case op name ([`crate::Op::name`]): `SINK PARAM DEFINE_VAR CONST SPECIAL RANGE
//!   END BIND AFTER INDEX LOAD STORE DEFINE_ACC ASSIGN NEG NOT SQRT RECIP EXP2 LOG2 EXP LOG SIN
//!   COS TRUNC ABS ADD SUB MUL DIV IDIV MOD MAX MIN POW AND OR XOR SHL SHR CMPLT CMPLE CMPEQ CMPNE
//!   WHERE MULACC CAST BITCAST VECTORIZE GEP PROGRAM DEVICE LINEAR SOURCE BINARY DEFINE_LOCAL
//!   BARRIER IF ENDIF WMMA`.
//! - `dtype` is the node's value type: `void`, a scalar (`bool i8 i16 i32 i64 u8 u16 u32 u64
//!   f16 bf16 f32 f64`), a vector `f32x4` (2 to 64 lanes), or a pointer `ptr<f32>` /
//!   `ptr<f32x4>` (global) or `lptr<f32>` (local). It may be left out only on SINK, STORE,
//!   BARRIER, IF, ENDIF, PROGRAM, DEVICE, LINEAR, SOURCE and BINARY, and then means `void`;
//!   every other op needs it (the parser never infers a type).
//! - The operands are the names in parentheses, in order; a node without operands may
//!   leave out the parentheses.
//! - The root of the graph is the node on the last line, which may be unnamed (typically
//!   `SINK void (...)`). Every other node must be used by a later line: a node that is not
//!   would be silently dropped, so it is an error.
//! - `#` starts a comment (outside strings); blank lines are ignored.
//!
//! # Arguments
//!
//! | op | argument | example |
//! |---|---|---|
//! | CONST | integer, float or bool, matching the dtype | `CONST i32 -7`, `CONST f32 1.0`, `CONST bool true` |
//! | PARAM | buffer slot | `PARAM ptr<f32> 0 (%n)` |
//! | RANGE | axis (smaller = outer) | `RANGE i32 0 (%n)` |
//! | GEP | lane | `GEP f32 3 (%v)` |
//! | DEFINE_ACC | accumulator id (keeps equal-looking accumulators apart) | `DEFINE_ACC f32 0 (%zero, %r)` |
//! | DEFINE_LOCAL | local memory id (keeps equal-looking arrays apart) | `DEFINE_LOCAL lptr<f32> 0 (%c256)` |
//! | DEFINE_VAR | `"name" min max` | `DEFINE_VAR i32 "n" 1 1024` |
//! | SPECIAL | launch index name | `SPECIAL i32 "gidx0" (%n)` |
//! | STORE | optional hint: `"nontemporal"` ([`crate::StoreHint`]) | `STORE void "nontemporal" (%p, %v)` |
//! | SOURCE | source text | `SOURCE void "int x;\n"` |
//! | PROGRAM | optional kernel name | `PROGRAM void "add" (%sink, %dev, %src)` |
//! | DEVICE | `device` and a device name | `DEVICE void device CUDA:1` |
//! | BINARY | bytes in hex | `BINARY void 0x7f454c46` |
//! | WMMA | shape, input and accumulator dtypes, threads ([`crate::Wmma`]) | `WMMA f32x4 m16n8k16 f16 f32 threads 32 (%a, %b, %c)` |
//! | every other op | none | `ADD f32 (%x, %y)` |
//!
//! Literals:
//! - integer: decimal, or hex `0x`, octal `0o` or binary `0b` digits, with an optional
//!   sign, e.g. `0`, `-9223372036854775808`, `0x7fff`, `-0b101`. It must fit the dtype
//!   ([`crate::validate`] rejects `CONST u8 300`); a `u64` constant may be up to
//!   `18446744073709551615`. [`print`] writes decimal;
//! - float: has a `.` or an exponent (`1.0`, `-0.0`, `2.5e-7`, `1e300`), or is `inf`,
//!   `-inf`, `nan` (the quiet NaN `0x7ff8000000000000`) or `nan:0x` and 16 hex digits (any
//!   other NaN, by its bits). [`print`] writes the shortest text that reads back to the
//!   same bits, so constants survive exactly; `1` is an integer, `1.0` a float;
//! - string: `"..."` on one line, with the escapes `\"` `\\` `\n` `\r` `\t` `\0` and
//!   `\u{HEX}`;
//! - bytes (BINARY only; elsewhere `0x` starts a hex integer): `0x` then an even number of
//!   hex digits (`0x` alone is empty).
//!
//! # Work groups
//!
//! Work-group local memory is a `DEFINE_LOCAL` of a static element count (a CONST), used
//! like a PARAM; a `BARRIER` publishes the stores it names to the loads that address memory
//! through `AFTER(buffer, barrier)`; an `IF` block holds the nodes that depend on it and is
//! closed by an `ENDIF`:
//!
//! ```text
//! %c256 = CONST i32 256
//! %tmp  = DEFINE_LOCAL lptr<f32> 0 (%c256)       # 256 f32 shared by the work group
//! %pt   = INDEX lptr<f32> (%tmp, %l)             # %l: SPECIAL "lidx0" (%c256)
//! %st   = STORE (%pt, %x)
//! %bar  = BARRIER (%st)                          # every item's store is done and visible
//! %tmp1 = AFTER lptr<f32> (%tmp, %bar)
//! %p0   = INDEX lptr<f32> (%tmp1, %zero)
//! %y    = LOAD f32 (%p0)
//! %is0  = CMPEQ bool (%l, %zero)
//! %if   = IF (%is0)                              # if (lidx0 == 0) {
//! %out1 = AFTER ptr<f32> (%out, %if)
//! %po   = INDEX ptr<f32> (%out1, %g)
//! %st2  = STORE (%po, %y)
//! %eif  = ENDIF (%if, %st2)                      # }
//! ```
//!
//! # Grammar
//!
//! ```text
//! kernel  = { line } ;                          (at least one node)
//! line    = [ node ] [ "#" any-text ] NEWLINE ;
//! node    = [ NAME "=" ] OP [ DTYPE ] [ arg ] [ "(" [ NAME { "," NAME } [ "," ] ] ")" ] ;
//! arg     = INT | FLOAT | "true" | "false" | STRING | STRING INT INT | "device" DEVICE | BYTES ;
//! NAME    = "%" ( letter | digit | "_" | "." ) { letter | digit | "_" | "." } ;
//! ```
//!
//! # Printing
//!
//! [`print`] writes a `# kiln kernel v1` header, then one line per node in
//! `root.toposort()` order named `%0`, `%1`, ... (the numbering [`crate::validate`] uses in
//! its messages), and the root last. Every dtype is written, including `void`.
//!
//! # Errors
//!
//! Every failure of [`parse`] is an [`IrError::Parse`] with the 1-based line and column
//! (in characters) of the offending token: malformed syntax, an unknown op or dtype, an
//! undefined, reused or unused name, an argument of the wrong kind for the op, and empty
//! input. `parse` only checks the text; whether the dtypes and operands make a valid
//! kernel is [`parse_kernel`]'s (or the caller's [`crate::validate`]) job.

use std::fmt::{self, Write as _};
use std::sync::Arc;

use rustc_hash::FxHashMap as HashMap;

use crate::dtype::{DType, DeviceSpec, Scalar};
use crate::uop::{Arg, Op, UOp};
use crate::wmma::Wmma;
use crate::{IrError, linearize, validate};

/// The bits `nan` stands for: the quiet NaN with no payload. Spelled out rather than taken
/// from `f64::NAN`, whose bit pattern Rust does not promise.
const QUIET_NAN: u64 = 0x7ff8_0000_0000_0000;

/// Writes `root` and everything below it, one node per line, root last (see the module
/// docs). Never fails; for every graph whose arguments follow the per-op table,
/// `parse(&print(root))` returns `root` itself.
pub fn print(root: &Arc<UOp>) -> String {
    let order = root.toposort();
    let ids: HashMap<*const UOp, usize> = order.iter().enumerate().map(|(i, n)| (Arc::as_ptr(n), i)).collect();
    let width = format!("%{}", order.len().saturating_sub(1)).len();
    let mut out = String::from("# kiln kernel v1\n");
    for (i, node) in order.iter().enumerate() {
        let name = format!("%{i}");
        let _ = write!(out, "{name:<width$} = {} {}", node.op().name(), node.dtype());
        let arg = match (node.op(), node.dtype(), node.arg()) {
            // A u64 constant holds its value's bits: write the value.
            (Op::Const, DType::Scalar(Scalar::U64), Arg::Int(v)) => (*v as u64).to_string(),
            (_, _, arg) => arg_text(arg),
        };
        if !arg.is_empty() {
            out.push(' ');
            out.push_str(&arg);
        }
        if !node.src().is_empty() {
            let srcs: Vec<String> =
                node.src().iter().map(|s| format!("%{}", ids.get(&Arc::as_ptr(s)).copied().unwrap_or(0))).collect();
            let _ = write!(out, " ({})", srcs.join(", "));
        }
        out.push('\n');
    }
    out
}

/// Where node `%N` of the kernel in `text` is defined: its name and line, e.g. `%pc (line 12)`.
/// `N` numbers nodes in [`print()`] order of the parsed root, as validation and the bounds proof
/// ([`crate::bounds::OutOfBounds::node`]) report them. `None` when `text` does not parse or has
/// no such node.
pub fn locate_node(text: &str, node: usize) -> Option<String> {
    let parsed = parse_defs(text).ok()?;
    let found = parsed.root.toposort().get(node)?.clone();
    let def = &parsed.defs[*parsed.by_node().get(&Arc::as_ptr(&found))?];
    Some(format!("{} (line {})", def.label(), def.line))
}

/// The largest kernel file kiln reads: far above any real kernel (a 4,096-deep kernel is
/// about 200 KiB of text), and a bound on what a wrong path (`/dev/zero`) can make it read.
pub const MAX_KERNEL_FILE_BYTES: u64 = 64 << 20;

/// Reads a kernel file as text, refusing files over [`MAX_KERNEL_FILE_BYTES`] (without reading
/// past that bound) and text that is not UTF-8.
///
/// # Errors
/// The I/O error; [`std::io::ErrorKind::InvalidData`] for a file over the bound or not UTF-8.
pub fn read_kernel_file(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)?.take(MAX_KERNEL_FILE_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_KERNEL_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {} MiB, the most a kernel file may hold", MAX_KERNEL_FILE_BYTES >> 20),
        ));
    }
    Ok(text)
}

/// The entry-point name of the kernel in file `path`: its stem made into a C identifier
/// (`dir/my-kernel.kiln` → `my_kernel`); a name starting with a digit gets a `k_` prefix.
pub fn entry_name(path: &std::path::Path) -> String {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let mut name: String = stem.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert_str(0, "k_");
    }
    name
}

/// Reads a graph written in the text format and returns its root (the node on the last
/// line). Purely syntactic: the graph is not validated (use [`parse_kernel`] for that).
/// Never panics.
///
/// # Errors
/// [`IrError::Parse`] with the line and column of the offending token: malformed syntax, an
/// unknown op or dtype, an undefined, reused or unused name, an argument of the wrong kind for
/// the op, or empty input.
pub fn parse(text: &str) -> Result<Arc<UOp>, IrError> {
    Ok(parse_defs(text)?.root)
}

/// Parses a kernel (the last line must be a SINK), then runs [`crate::validate`] and
/// [`crate::linearize`] on it. A dtype or operand error is reported as [`IrError::Parse`] at
/// the line that defines the offending node, e.g. `line 7, column 8: %sum = ADD: operands
/// have different dtypes: f32 and i32`; a loop-structure error stays [`IrError::Structure`]
/// with its `%N` node numbers replaced by the names and lines of the text.
///
/// # Errors
/// [`IrError::Parse`] for everything [`parse`] rejects, for a last line that is not a SINK,
/// and for a node that fails [`crate::validate`]; [`IrError::Structure`] for loops that
/// [`crate::linearize`] cannot lay out.
pub fn parse_kernel(text: &str) -> Result<Arc<UOp>, IrError> {
    let parsed = parse_defs(text)?;
    let root = parsed.root.clone();
    if root.op() != Op::Sink {
        let last = parsed.defs.last().map(|d| (d.line, d.col)).unwrap_or((1, 1));
        return Err(IrError::Parse {
            line: last.0,
            col: last.1,
            message: format!(
                "a kernel's last line must be its SINK, got {}; use parse() for other graphs",
                root.op().name()
            ),
        });
    }
    let order = root.toposort();
    let by_node = parsed.by_node();
    let locate = |n: usize| order.get(n).and_then(|node| by_node.get(&Arc::as_ptr(node))).map(|&d| &parsed.defs[d]);
    let relocate = |e: IrError| match e {
        IrError::Type { node, op, message } => match locate(node) {
            Some(def) => {
                // The most likely slip when writing by hand: `CONST f32 1` (an integer).
                let hint = if op == "CONST" && message.contains("does not fit") {
                    " (integers are written 7, floats 7.0, bools true)"
                } else {
                    ""
                };
                IrError::Parse {
                    line: def.line,
                    col: def.col,
                    message: format!("{} = {op}: {message}{hint}", def.label()),
                }
            }
            None => IrError::Type { node, op, message },
        },
        IrError::Structure(message) => IrError::Structure(rename_nodes(&message, |n| {
            locate(n).map(|d| format!("{} (line {})", d.label(), d.line))
        })),
        other => other,
    };
    validate(&root).map_err(relocate)?;
    linearize(&root).map_err(relocate)?;
    Ok(root)
}

/// Replaces every `%N` in `message` for which `name` knows a better label.
fn rename_nodes(message: &str, name: impl Fn(usize) -> Option<String>) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(p) = rest.find('%') {
        out.push_str(&rest[..p]);
        let after = &rest[p + 1..];
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        match after[..digits].parse::<usize>().ok().and_then(&name) {
            Some(label) => out.push_str(&label),
            None => {
                out.push('%');
                out.push_str(&after[..digits]);
            }
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

// ---------------------------------------------------------------- printing helpers

/// An argument as the text format writes it (`7`, `1.5`, `"gidx0"`, `"n" 1 16`,
/// `device CPU`, `0x7f45`), or `no argument`: messages show arguments this way, never as
/// Rust debug output.
impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::None => f.write_str("no argument"),
            arg => f.write_str(&arg_text(arg)),
        }
    }
}

fn arg_text(arg: &Arg) -> String {
    match arg {
        Arg::None => String::new(),
        Arg::Int(v) => v.to_string(),
        Arg::Float(v) => float_text(*v),
        Arg::Bool(v) => v.to_string(),
        Arg::Str(s) => quote(s),
        Arg::Var { name, min, max } => format!("{} {min} {max}", quote(name)),
        Arg::Device(d) => format!("device {d}"),
        Arg::Wmma(w) => w.text(),
        Arg::Bytes(b) => {
            let mut s = String::with_capacity(2 + 2 * b.len());
            s.push_str("0x");
            for byte in b {
                let _ = write!(s, "{byte:02x}");
            }
            s
        }
    }
}

/// The shortest text that reads back to exactly `v`'s bits, always recognisable as a float.
fn float_text(v: f64) -> String {
    if v.is_nan() {
        if v.to_bits() == QUIET_NAN { "nan".into() } else { format!("nan:0x{:016x}", v.to_bits()) }
    } else if v.is_infinite() {
        if v > 0.0 { "inf".into() } else { "-inf".into() }
    } else {
        // Debug is Rust's shortest round-trip form and always has a `.` or an exponent.
        format!("{v:?}")
    }
}

fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\0' => out.push_str("\\0"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---------------------------------------------------------------- lexing

#[derive(Debug, Clone, PartialEq)]
enum Tok<'a> {
    /// `%name`, without the `%`.
    Name(&'a str),
    Eq,
    Open,
    Close,
    Comma,
    Str(String),
    /// Any other run of characters: op names, dtypes, numbers, keywords.
    Word(&'a str),
}

#[derive(Debug, Clone)]
struct Token<'a> {
    tok: Tok<'a>,
    /// Byte offset in the line.
    at: usize,
}

/// One line of input, for error positions.
#[derive(Clone, Copy)]
struct Line<'a> {
    text: &'a str,
    number: usize,
}

impl Line<'_> {
    fn err(&self, at: usize, message: impl Into<String>) -> IrError {
        let col = self.text.get(..at).map_or(at, |s| s.chars().count()) + 1;
        IrError::Parse { line: self.number, col, message: message.into() }
    }

    /// Column (1-based, in characters) of a byte offset.
    fn col(&self, at: usize) -> usize {
        self.text.get(..at).map_or(at, |s| s.chars().count()) + 1
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '.'
}

/// Splits a line into tokens, into `toks` (cleared first, so one vector serves every line);
/// returns the byte offset just past the last token (where "missing ..." errors point).
fn lex<'a>(line: Line<'a>, toks: &mut Vec<Token<'a>>) -> Result<usize, IrError> {
    let text = line.text;
    toks.clear();
    let mut stop = 0;
    let mut chars = text.char_indices().peekable();
    while let Some(&(at, c)) = chars.peek() {
        match c {
            c if c.is_whitespace() => {
                chars.next();
                continue;
            }
            '#' => break,
            '=' | '(' | ')' | ',' => {
                chars.next();
                let tok = match c {
                    '=' => Tok::Eq,
                    '(' => Tok::Open,
                    ')' => Tok::Close,
                    _ => Tok::Comma,
                };
                toks.push(Token { tok, at });
            }
            '%' => {
                chars.next();
                let start = at + 1;
                let mut end = start;
                while let Some(&(i, c)) = chars.peek() {
                    if !is_name_char(c) {
                        break;
                    }
                    end = i + c.len_utf8();
                    chars.next();
                }
                if end == start {
                    return Err(line.err(at, "expected a name after `%` (letters, digits, `_` or `.`, e.g. %x or %0)"));
                }
                toks.push(Token { tok: Tok::Name(&text[start..end]), at });
            }
            '"' => {
                chars.next();
                let mut s = String::new();
                let mut closed = false;
                while let Some((i, c)) = chars.next() {
                    match c {
                        '"' => {
                            closed = true;
                            break;
                        }
                        '\\' => s.push(unescape(line, i, &mut chars)?),
                        c => s.push(c),
                    }
                }
                if !closed {
                    return Err(line
                        .err(at, "unterminated string: close it with `\"` on the same line (write a newline as \\n)"));
                }
                toks.push(Token { tok: Tok::Str(s), at });
            }
            _ => {
                let mut end = at;
                while let Some(&(i, c)) = chars.peek() {
                    if c.is_whitespace() || "%=(),#\"".contains(c) {
                        break;
                    }
                    end = i + c.len_utf8();
                    chars.next();
                }
                toks.push(Token { tok: Tok::Word(&text[at..end]), at });
            }
        }
        stop = chars.peek().map_or(text.len(), |&(i, _)| i);
    }
    Ok(stop)
}

/// Reads the escape after a `\` at byte `at`.
fn unescape(
    line: Line<'_>,
    at: usize,
    chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>,
) -> Result<char, IrError> {
    let bad = || line.err(at, "unknown escape: use \\\" \\\\ \\n \\r \\t \\0 or \\u{HEX}");
    match chars.next() {
        Some((_, '"')) => Ok('"'),
        Some((_, '\\')) => Ok('\\'),
        Some((_, 'n')) => Ok('\n'),
        Some((_, 'r')) => Ok('\r'),
        Some((_, 't')) => Ok('\t'),
        Some((_, '0')) => Ok('\0'),
        Some((_, 'u')) => {
            if !matches!(chars.next(), Some((_, '{'))) {
                return Err(bad());
            }
            let mut hex = String::new();
            loop {
                match chars.next() {
                    Some((_, '}')) => break,
                    Some((_, c)) if c.is_ascii_hexdigit() && hex.len() < 6 => hex.push(c),
                    _ => return Err(bad()),
                }
            }
            u32::from_str_radix(&hex, 16)
                .ok()
                .and_then(char::from_u32)
                .ok_or_else(|| line.err(at, format!("\\u{{{hex}}} is not a Unicode scalar value")))
        }
        _ => Err(bad()),
    }
}

// ---------------------------------------------------------------- parsing

/// One parsed line: where it is and what it made.
struct Def<'a> {
    name: Option<&'a str>,
    line: usize,
    /// Column of the op name.
    col: usize,
}

impl Def<'_> {
    fn label(&self) -> String {
        match self.name {
            Some(n) => format!("%{n}"),
            None => "the root".into(),
        }
    }
}

struct Parsed<'a> {
    root: Arc<UOp>,
    /// One per line that defines a node, in order.
    defs: Vec<Def<'a>>,
    /// The node each entry of `defs` made.
    nodes: Vec<Arc<UOp>>,
}

impl Parsed<'_> {
    /// Node → index of the first line that defined it (equal lines make one node): for error
    /// messages only, so built on demand.
    fn by_node(&self) -> HashMap<*const UOp, usize> {
        let mut by_node = HashMap::default();
        for (d, n) in self.nodes.iter().enumerate() {
            by_node.entry(Arc::as_ptr(n)).or_insert(d);
        }
        by_node
    }
}

fn parse_defs(text: &str) -> Result<Parsed<'_>, IrError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<Line<'_>> = text.lines().enumerate().map(|(i, t)| Line { text: t, number: i + 1 }).collect();
    let mut defs: Vec<Def> = Vec::new();
    let mut nodes: Vec<Arc<UOp>> = Vec::new();
    let mut names: HashMap<&str, usize> = HashMap::default();
    let mut used: Vec<bool> = Vec::new();
    let mut toks = Vec::new();
    for (k, &line) in lines.iter().enumerate() {
        let stop = lex(line, &mut toks)?;
        if toks.is_empty() {
            continue;
        }
        // An unnamed line must be the root: anything after it would leave it unused.
        if let Some(prev) = defs.last()
            && prev.name.is_none()
        {
            return Err(IrError::Parse {
                line: prev.line,
                col: 1,
                message: "only the last line (the root) may be unnamed: give this node a %name and use it".into(),
            });
        }
        let def = parse_line(line, &toks, stop, &names, &nodes, &lines[k + 1..], &mut used)?;
        if let Some(name) = def.name {
            if let Some(&earlier) = names.get(name) {
                return Err(line.err(
                    toks[0].at,
                    format!("%{name} is already defined on line {}; every name is defined once", defs[earlier].line),
                ));
            }
            names.insert(name, defs.len());
        }
        defs.push(Def { name: def.name, line: line.number, col: def.col });
        nodes.push(def.node);
        used.push(false);
    }
    let Some(root) = nodes.last().cloned() else {
        return Err(IrError::Parse {
            line: 1,
            col: 1,
            message: "empty kernel: no nodes (the last line defines the root, e.g. `SINK void (%st)`)".into(),
        });
    };
    if let Some(d) = (0..defs.len() - 1).find(|&d| !used[d]) {
        return Err(IrError::Parse {
            line: defs[d].line,
            col: 1,
            message: format!(
                "{} is never used: every node except the root (the last line) must be an operand of a later one",
                defs[d].label()
            ),
        });
    }
    Ok(Parsed { root, defs, nodes })
}

struct LineDef<'a> {
    name: Option<&'a str>,
    col: usize,
    node: Arc<UOp>,
}

fn parse_line<'a>(
    line: Line<'a>,
    toks: &[Token<'a>],
    end: usize,
    names: &HashMap<&str, usize>,
    nodes: &[Arc<UOp>],
    later: &[Line<'_>],
    used: &mut [bool],
) -> Result<LineDef<'a>, IrError> {
    let mut pos = 0;
    let name = match toks.first().map(|t| &t.tok) {
        Some(Tok::Name(n)) => {
            match toks.get(1) {
                Some(Token { tok: Tok::Eq, .. }) => {}
                Some(t) => return Err(line.err(t.at, format!("expected `=` after %{n}"))),
                None => return Err(line.err(end, format!("expected `= OP ...` after %{n}"))),
            }
            pos = 2;
            Some(*n)
        }
        Some(Tok::Word(w)) if matches!(toks.get(1), Some(Token { tok: Tok::Eq, .. })) => {
            return Err(line.err(toks[0].at, format!("node names start with `%`: write %{w} = ...")));
        }
        _ => None,
    };

    // The op.
    let (op, op_at) = match toks.get(pos) {
        Some(Token { tok: Tok::Word(w), at }) => (Op::from_name(w).ok_or_else(|| line.err(*at, unknown_op(w)))?, *at),
        Some(t) => return Err(line.err(t.at, "expected an op name such as CONST, LOAD or ADD")),
        None => return Err(line.err(end, "expected an op name after `=`")),
    };
    pos += 1;

    // The dtype: a word that does not start an argument.
    let dtype = match toks.get(pos) {
        Some(Token { tok: Tok::Word(w), at }) if !starts_arg(w) => {
            pos += 1;
            w.parse::<DType>().map_err(|e| line.err(*at, dtype_message(e)))?
        }
        _ if may_omit_dtype(op) => DType::Void,
        next => {
            let at = next.map_or(end, |t| t.at);
            return Err(
                line.err(at, format!("{} needs a dtype after the op name (e.g. f32, i32, ptr<f32>, void)", op.name()))
            );
        }
    };

    // The argument: the words and strings up to `(` or the end.
    let arg_start = pos;
    while matches!(toks.get(pos), Some(Token { tok: Tok::Word(_) | Tok::Str(_), .. })) {
        pos += 1;
    }
    let arg = parse_arg(line, op, dtype, &toks[arg_start..pos], toks.get(pos).map_or(end, |t| t.at), op_at)?;

    // The operands.
    let mut src = Vec::new();
    let current = name;
    match toks.get(pos) {
        None => {}
        Some(Token { tok: Tok::Open, .. }) => {
            pos += 1;
            loop {
                match toks.get(pos) {
                    Some(Token { tok: Tok::Close, .. }) => {
                        pos += 1;
                        break;
                    }
                    Some(Token { tok: Tok::Name(n), at }) => {
                        let d = lookup(line, *at, n, current, names, later)?;
                        if let Some(u) = used.get_mut(d) {
                            *u = true;
                        }
                        if let Some(node) = nodes.get(d) {
                            src.push(node.clone());
                        }
                        pos += 1;
                        match toks.get(pos) {
                            Some(Token { tok: Tok::Comma, .. }) => pos += 1,
                            Some(Token { tok: Tok::Close, .. }) => {}
                            Some(t) => return Err(line.err(t.at, "expected `,` or `)` after an operand")),
                            None => return Err(line.err(end, "missing `)` to close the operand list")),
                        }
                    }
                    Some(t) => {
                        return Err(line.err(t.at, "expected an operand name such as %x (operands are earlier nodes)"));
                    }
                    None => return Err(line.err(end, "missing `)` to close the operand list")),
                }
            }
        }
        Some(t) => {
            return Err(line.err(
                t.at,
                "unexpected token: a line is `%name = OP dtype [arg] (%operand, ...)`; operands go in parentheses",
            ));
        }
    }
    if let Some(t) = toks.get(pos) {
        return Err(line.err(t.at, "unexpected text after the operand list (start comments with #)"));
    }
    Ok(LineDef { name, col: line.col(op_at), node: UOp::new(op, dtype, arg, src) })
}

fn lookup(
    line: Line<'_>,
    at: usize,
    name: &str,
    current: Option<&str>,
    names: &HashMap<&str, usize>,
    later: &[Line<'_>],
) -> Result<usize, IrError> {
    if let Some(&d) = names.get(name) {
        return Ok(d);
    }
    if current == Some(name) {
        return Err(line.err(at, format!("%{name} is used in its own definition")));
    }
    let mut toks = Vec::new();
    let defined_later = later.iter().find(|l| {
        lex(**l, &mut toks).is_ok()
            && matches!(toks.as_slice(), [Token { tok: Tok::Name(n), .. }, Token { tok: Tok::Eq, .. }, ..] if *n == name)
    });
    Err(match defined_later {
        Some(l) => line.err(
            at,
            format!("%{name} is used before its definition on line {}: define nodes before their users", l.number),
        ),
        None => line.err(at, format!("undefined %{name}")),
    })
}

/// Ops whose dtype is always `void` and may be left out.
fn may_omit_dtype(op: Op) -> bool {
    matches!(
        op,
        Op::Sink
            | Op::Store
            | Op::Barrier
            | Op::If
            | Op::EndIf
            | Op::Program
            | Op::Device
            | Op::Linear
            | Op::Source
            | Op::Binary
    )
}

/// Whether a word after the op is the start of an argument rather than a dtype.
fn starts_arg(w: &str) -> bool {
    w.starts_with(|c: char| c.is_ascii_digit() || "+-.".contains(c))
        || ["true", "false", "device", "inf", "infinity"].iter().any(|k| w.eq_ignore_ascii_case(k))
        || w.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("nan"))
}

fn dtype_message(e: IrError) -> String {
    match e {
        IrError::Invalid(m) => m,
        other => other.to_string(),
    }
}

fn unknown_op(w: &str) -> String {
    let upper = w.to_ascii_uppercase();
    let mut near: Vec<(usize, &str)> = Op::ALL
        .iter()
        .map(|op| op.name())
        .filter_map(|n| {
            let d = edit_distance(&upper, n);
            (d <= 2 || (upper.len() >= 2 && n.contains(upper.as_str()))).then_some((d, n))
        })
        .collect();
    near.sort();
    let hint = match near.first() {
        Some((_, n)) => format!(" (did you mean {n}?)"),
        None => String::new(),
    };
    let all: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
    let case = if w.chars().any(|c| c.is_ascii_lowercase()) { "ops are upper case; " } else { "" };
    format!("unknown op `{w}`{hint}; {case}the ops are: {}", all.join(" "))
}

/// Edit distance counting a swap of neighbours as one edit (`LAOD` is 1 from `LOAD`): what
/// kiln's "did you mean" hints measure.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let mut best =
                (d[i - 1][j - 1] + usize::from(a[i - 1] != b[j - 1])).min(d[i - 1][j] + 1).min(d[i][j - 1] + 1);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// The argument kinds an op accepts.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    None,
    Int,
    Float,
    Bool,
    Str,
    Var,
    Device,
    Bytes,
    Wmma,
}

fn kind_of(arg: &Arg) -> Kind {
    match arg {
        Arg::None => Kind::None,
        Arg::Int(_) => Kind::Int,
        Arg::Float(_) => Kind::Float,
        Arg::Bool(_) => Kind::Bool,
        Arg::Str(_) => Kind::Str,
        Arg::Var { .. } => Kind::Var,
        Arg::Device(_) => Kind::Device,
        Arg::Bytes(_) => Kind::Bytes,
        Arg::Wmma(_) => Kind::Wmma,
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::None => "no argument",
        Kind::Int => "an integer",
        Kind::Float => "a float",
        Kind::Bool => "a bool",
        Kind::Str => "a string",
        Kind::Var => "a variable (\"name\" min max)",
        Kind::Device => "a device",
        Kind::Bytes => "bytes",
        Kind::Wmma => "a WMMA shape (m16n8k16 f16 f32 threads 32)",
    }
}

/// What each op takes, and an example line to show when it gets something else.
fn accepted(op: Op) -> (&'static [Kind], &'static str) {
    match op {
        Op::Const => (&[Kind::Int, Kind::Float, Kind::Bool], "`CONST i32 7`, `CONST f32 1.0` or `CONST bool true`"),
        Op::Param => (&[Kind::Int], "its slot: `PARAM ptr<f32> 0 (%n)`"),
        Op::Range => (&[Kind::Int], "its axis: `RANGE i32 0 (%n)`"),
        Op::DefineAcc => (&[Kind::Int], "its id: `DEFINE_ACC f32 0 (%zero, %r)`"),
        Op::DefineLocal => (&[Kind::Int], "its id: `DEFINE_LOCAL lptr<f32> 0 (%size)`"),
        Op::Gep => (&[Kind::Int], "the lane: `GEP f32 2 (%v)`"),
        Op::DefineVar => (&[Kind::Var], "name and bounds: `DEFINE_VAR i32 \"n\" 1 1024`"),
        Op::Special => (&[Kind::Str], "its name: `SPECIAL i32 \"gidx0\" (%n)`"),
        Op::Source => (&[Kind::Str], "the source text: `SOURCE void \"...\"`"),
        Op::Program => (&[Kind::None, Kind::Str], "an optional name: `PROGRAM void \"add\" (%sink, %dev, %src)`"),
        Op::Store => (&[Kind::None, Kind::Str], "an optional hint: `STORE void \"nontemporal\" (%p, %v)`"),
        Op::Device => (&[Kind::Device], "the device: `DEVICE void device CPU`"),
        Op::Binary => (&[Kind::Bytes], "the bytes in hex: `BINARY void 0x7f454c46`"),
        Op::Wmma => (
            &[Kind::Wmma],
            "shape, input and accumulator dtypes, threads: `WMMA f32x4 m16n8k16 f16 f32 threads 32 (%a, %b, %c)`",
        ),
        _ => (&[Kind::None], "no argument: constants are separate CONST nodes"),
    }
}

/// Reads the argument tokens of one line and checks the kind against the op.
/// `after` is where the argument would be when missing; `op_at` is the op's position.
fn parse_arg(
    line: Line<'_>,
    op: Op,
    dtype: DType,
    toks: &[Token<'_>],
    after: usize,
    op_at: usize,
) -> Result<Arg, IrError> {
    let int = |t: &Token<'_>| -> Result<i64, IrError> {
        match &t.tok {
            Tok::Word(w) => parse_int(w).map_err(|m| line.err(t.at, m)),
            _ => Err(line.err(t.at, "expected an integer")),
        }
    };
    if op == Op::Wmma && !toks.is_empty() {
        return parse_wmma(line, toks, after);
    }
    let arg = match toks {
        [] => Arg::None,
        [Token { tok: Tok::Word(kw), .. }, rest @ ..] if kw.eq_ignore_ascii_case("device") => match rest {
            [Token { tok: Tok::Word(d), at: dat }] => {
                Arg::Device(d.parse::<DeviceSpec>().map_err(|e| line.err(*dat, dtype_message(e)))?)
            }
            [] => {
                return Err(
                    line.err(after, "expected a device name after `device`, e.g. `device CPU` or `device CUDA:1`")
                );
            }
            [_, extra, ..] | [extra] => {
                return Err(line.err(extra.at, "expected one device name such as CPU, OPENCL:0 or CUDA:1"));
            }
        },
        [Token { tok: Tok::Str(s), .. }] => Arg::Str(s.clone()),
        [Token { tok: Tok::Str(s), .. }, a, b] => Arg::Var { name: s.clone(), min: int(a)?, max: int(b)? },
        [Token { tok: Tok::Str(_), .. }, t] | [Token { tok: Tok::Str(_), .. }, _, _, t, ..] => {
            return Err(line.err(t.at, "a string argument stands alone, or is a variable `\"name\" min max`"));
        }
        [Token { tok: Tok::Word(w), at }] => literal(w, op, dtype).map_err(|m| line.err(*at, m))?,
        [_, t, ..] => return Err(line.err(t.at, "too many arguments: a node has at most one")),
        [t] => return Err(line.err(t.at, "expected an argument (a number, string, bytes or `device NAME`)")),
    };
    let (kinds, example) = accepted(op);
    if kinds.contains(&kind_of(&arg)) {
        return Ok(arg);
    }
    let at = toks.first().map_or(op_at, |t| t.at);
    Err(line.err(at, format!("{} takes {example}; got {}", op.name(), kind_name(kind_of(&arg)))))
}

/// WMMA's argument: `m16n8k16 f16 f32 threads 32` (shape, input dtype, accumulator dtype,
/// thread count). Whether the combination is one kiln defines is [`crate::validate`]'s call.
fn parse_wmma(line: Line<'_>, toks: &[Token<'_>], after: usize) -> Result<Arg, IrError> {
    const FORM: &str = "a WMMA argument is `mMnNkK INPUT ACC threads T`, e.g. `m16n8k16 f16 f32 threads 32`";
    let word = |i: usize| match toks.get(i) {
        Some(Token { tok: Tok::Word(w), at }) => Ok((*w, *at)),
        Some(t) => Err(line.err(t.at, FORM)),
        None => Err(line.err(after, FORM)),
    };
    let (shape, at) = word(0)?;
    let (m, n, k) =
        Wmma::parse_shape(shape).ok_or_else(|| line.err(at, format!("`{shape}` is not a shape: {FORM}")))?;
    let scalar = |i: usize| -> Result<Scalar, IrError> {
        let (w, at) = word(i)?;
        match w.parse::<DType>() {
            Ok(DType::Scalar(s)) => Ok(s),
            _ => Err(line.err(at, format!("`{w}` is not a scalar dtype: {FORM}"))),
        }
    };
    let (input, acc) = (scalar(1)?, scalar(2)?);
    let (kw, at) = word(3)?;
    if kw != "threads" {
        return Err(line.err(at, format!("expected `threads`: {FORM}")));
    }
    let (t, at) = word(4)?;
    let threads = t.parse::<u16>().map_err(|_| line.err(at, format!("`{t}` is not a thread count: {FORM}")))?;
    if let Some(extra) = toks.get(5) {
        return Err(line.err(extra.at, format!("unexpected text after the thread count: {FORM}")));
    }
    Ok(Arg::Wmma(Wmma { m, n, k, input, acc, threads }))
}

fn parse_int(w: &str) -> Result<i64, String> {
    i64::try_from(parse_integer(w)?).map_err(|_| format!("integer `{w}` does not fit in 64 bits"))
}

/// An integer literal: decimal, or `0x` hex, `0o` octal, `0b` binary digits, with an optional
/// sign. Anything from `i64::MIN` to `u64::MAX` (a u64 constant's largest value) is read;
/// the caller decides what fits.
fn parse_integer(w: &str) -> Result<i128, String> {
    let (negative, body) = match w.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, w.strip_prefix('+').unwrap_or(w)),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits) = match lower.get(..2) {
        Some("0x") => (16, &lower[2..]),
        Some("0o") => (8, &lower[2..]),
        Some("0b") => (2, &lower[2..]),
        _ => (10, lower.as_str()),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(format!("`{w}` is not an integer (write 42, -7, 0x2a, 0o52 or 0b101010)"));
    }
    let too_big = || format!("integer `{w}` does not fit in 64 bits");
    let magnitude = u64::from_str_radix(digits, radix).map_err(|_| too_big())? as i128;
    let v = if negative { -magnitude } else { magnitude };
    if v < i64::MIN as i128 { Err(too_big()) } else { Ok(v) }
}

/// Whether `lower` (lower case) is written as an integer with a radix prefix (`0x1f`, `-0b1`).
fn has_radix_prefix(lower: &str) -> bool {
    let body = lower.strip_prefix(['-', '+']).unwrap_or(lower);
    ["0x", "0o", "0b"].iter().any(|p| body.starts_with(p))
}

/// A single-word argument of `op` (whose dtype is `dtype`): bool, bytes, float or integer.
/// `0x...` is bytes for ops that take bytes (BINARY) and a hex integer for the others.
fn literal(w: &str, op: Op, dtype: DType) -> Result<Arg, String> {
    let lower = w.to_ascii_lowercase();
    match lower.as_str() {
        "true" => return Ok(Arg::Bool(true)),
        "false" => return Ok(Arg::Bool(false)),
        "nan" => return Ok(Arg::Float(f64::from_bits(QUIET_NAN))),
        "inf" | "+inf" | "infinity" | "+infinity" => return Ok(Arg::Float(f64::INFINITY)),
        "-inf" | "-infinity" => return Ok(Arg::Float(f64::NEG_INFINITY)),
        _ => {}
    }
    if let Some(bits) = lower.strip_prefix("nan:0x") {
        let v = u64::from_str_radix(bits, 16)
            .ok()
            .filter(|_| !bits.is_empty() && bits.len() <= 16 && !bits.starts_with('+'))
            .map(f64::from_bits)
            .ok_or_else(|| format!("`{w}`: expected nan:0x and up to 16 hex digits"))?;
        return if v.is_nan() {
            Ok(Arg::Float(v))
        } else {
            Err(format!("`{w}` is not a NaN bit pattern; write the number itself (e.g. 1.5)"))
        };
    }
    if let Some(hex) = lower.strip_prefix("0x")
        && accepted(op).0.contains(&Kind::Bytes)
    {
        return parse_hex(hex).map(Arg::Bytes).map_err(|m| format!("`{w}`: {m}"));
    }
    if !has_radix_prefix(&lower) && lower.contains(['.', 'e']) {
        return lower
            .parse::<f64>()
            .ok()
            .filter(|_| lower.chars().all(|c| c.is_ascii_digit() || "+-.e".contains(c)))
            .map(Arg::Float)
            .ok_or_else(|| format!("`{w}` is not a number (floats look like 1.0, -0.5, 2e-7, inf or nan)"));
    }
    let v = parse_integer(w)?;
    if op == Op::Const && dtype == DType::Scalar(Scalar::U64) {
        // u64 constants hold their value's bits (see `print`).
        return u64::try_from(v)
            .map(|u| Arg::Int(u as i64))
            .map_err(|_| format!("`{w}` does not fit u64 (range 0..={})", u64::MAX));
    }
    i64::try_from(v).map(Arg::Int).map_err(|_| format!("integer `{w}` does not fit in 64 bits"))
}

fn parse_hex(hex: &str) -> Result<Vec<u8>, String> {
    if hex.len() & 1 == 1 {
        return Err("bytes need an even number of hex digits".into());
    }
    hex.as_bytes()
        .chunks(2)
        .map(|pair| {
            std::str::from_utf8(pair)
                .ok()
                .and_then(|p| u8::from_str_radix(p, 16).ok().filter(|_| !p.starts_with('+')))
                .ok_or_else(|| "bytes are hex digits 0-9 a-f".to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{AddrSpace, Scalar};
    use crate::{KernelBuilder, Val};

    #[test]
    fn entry_names_are_c_identifiers() {
        use std::path::Path;
        assert_eq!(entry_name(Path::new("examples/kernels/add.kiln")), "add");
        assert_eq!(entry_name(Path::new("my-kernel.v2.kiln")), "my_kernel_v2");
        assert_eq!(entry_name(Path::new("2d.kiln")), "k_2d");
        assert_eq!(entry_name(Path::new("")), "k_");
    }

    /// Prints, parses back, and checks the result is the very same node and prints the same.
    fn round_trip(root: &Arc<UOp>) -> String {
        let text = print(root);
        let back = match parse(&text) {
            Ok(b) => b,
            Err(e) => panic!("{e}\n{text}"),
        };
        assert!(Arc::ptr_eq(&back, root), "round trip changed the graph:\n{text}");
        assert_eq!(print(&back), text);
        text
    }

    fn err_at(text: &str) -> (usize, usize, String) {
        match parse(text) {
            Err(IrError::Parse { line, col, message }) => (line, col, message),
            other => panic!("expected a parse error for {text:?}, got {other:?}"),
        }
    }

    fn elementwise() -> Arc<UOp> {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 1 << 24);
        let (a, b, c) = (k.param(0, Scalar::F32, &n), k.param(1, Scalar::F32, &n), k.param(2, Scalar::F32, &n));
        let i = k.global(0, &n);
        let sum = a.at(&i).load() * 2.5f32 + b.at(&i).load();
        k.store(&c.at(&i), &sum);
        k.finish().unwrap()
    }

    #[test]
    fn elementwise_kernel_round_trips_and_prints_in_toposort_order() {
        let k = elementwise();
        let text = round_trip(&k);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# kiln kernel v1");
        let order = k.toposort();
        assert_eq!(lines.len(), order.len() + 1);
        for (i, node) in order.iter().enumerate() {
            let (name, rest) = lines[i + 1].split_once(" = ").unwrap();
            assert_eq!(name.trim_end(), format!("%{i}"));
            assert!(rest.starts_with(&format!("{} {}", node.op().name(), node.dtype())), "{rest}");
        }
        assert!(lines.last().unwrap().contains("= SINK void ("));
        assert!(text.contains("DEFINE_VAR i32 \"n\" 1 16777216\n"));
        assert!(text.contains("CONST f32 2.5\n"));
        assert_eq!(parse_kernel(&text).unwrap(), k);
    }

    #[test]
    fn gated_load_and_store_round_trip() {
        let mut k = KernelBuilder::new();
        let n = k.var("n", 1, 4096);
        let (a, b) = (k.param(0, Scalar::F32, 1024), k.param(1, Scalar::F32, &n));
        let i = k.special("gidx0", &n);
        let inside = i.lt(1024);
        let x = a.at(&i).load_gated(&inside, -1.0);
        k.store_gated(&b.at(&i), &x, &inside);
        let sink = k.finish().unwrap();
        let text = round_trip(&sink);
        assert!(text.contains("CMPLT bool"), "{text}");
        assert!(text.contains("CONST f32 -1.0"), "{text}");
    }

    /// A non-temporal store prints its hint, parses back to the same node, and is a node
    /// distinct from the plain store of the same value (the hint is part of the identity).
    #[test]
    fn nontemporal_store_hint_round_trips_and_is_part_of_the_identity() {
        let build = |hint| {
            let mut k = KernelBuilder::new();
            let (a, c) = (k.param(0, Scalar::F32, 64), k.param(1, Scalar::F32, 64));
            let i = k.special("gidx0", 16);
            let v = a.at_vec(&(&i * 4), 4).load();
            k.store_hinted(&c.at_vec(&(&i * 4), 4), &v, hint);
            k.finish().unwrap()
        };
        let (nt, plain) = (build(crate::StoreHint::NonTemporal), build(crate::StoreHint::Normal));
        assert_ne!(nt.content_hash(), plain.content_hash());
        let text = round_trip(&nt);
        assert!(text.contains("STORE void \"nontemporal\" ("), "{text}");
        assert!(!round_trip(&plain).contains("nontemporal"));
        assert_eq!(nt.src()[0].store_hint(), crate::StoreHint::NonTemporal);
        assert_eq!(plain.src()[0].store_hint(), crate::StoreHint::Normal);
        let bad = text.replace("\"nontemporal\"", "\"streaming\"");
        match parse_kernel(&bad) {
            Err(IrError::Parse { message, .. }) => {
                assert!(message.contains("a store hint is \"nontemporal\""), "{message}")
            }
            other => panic!("{other:?}"),
        }
        let int_hint = text.replace("\"nontemporal\"", "1");
        assert!(err_at(&int_hint).2.contains("an optional hint"), "{}", err_at(&int_hint).2);
    }

    fn matmul() -> Arc<UOp> {
        let mut k = KernelBuilder::new();
        let (a, b, c) = (k.param(0, Scalar::F32, 64), k.param(1, Scalar::F32, 64), k.param(2, Scalar::F32, 64));
        let i = k.range(8);
        let j = k.range(8);
        let r1 = k.range(4);
        let r2 = k.range(2);
        let acc = k.acc(&Val::constant(DType::F32, 0.0), &[&r1, &r2]);
        let kk = &r1 * 2 + &r2;
        let prod = a.at(&(&i * 8 + &kk)).load() * b.at(&(&kk * 8 + &j)).load();
        let total = acc.update(&(acc.get() + prod));
        let st = k.store(&c.at(&(&i * 8 + &j)), &total);
        let ej = k.end(&j, &[&st]);
        k.end(&i, &[&ej]);
        k.finish().unwrap()
    }

    #[test]
    fn reduction_with_nested_ranges_round_trips() {
        let sink = matmul();
        let text = round_trip(&sink);
        for op in ["DEFINE_ACC f32 1", "ASSIGN f32", "END f32", "END void", "RANGE i32 3"] {
            assert!(text.contains(op), "{op} missing:\n{text}");
        }
        assert!(Arc::ptr_eq(&parse_kernel(&text).unwrap(), &sink));
    }

    #[test]
    fn vectors_casts_and_bitcasts_round_trip() {
        let mut k = KernelBuilder::new();
        let (a, b) = (k.param(0, Scalar::F32, 64), k.param(1, Scalar::F32, 64));
        let i = k.global(0, 16);
        let v = a.at_vec(&(&i * 4), 4).load();
        let lanes: Vec<Val> = (0..4).map(|l| v.gep(3 - l)).collect();
        let rev = Val::vectorize(&lanes);
        let scaled = rev * Val::constant(DType::vec(Scalar::F32, 4), 0.5) + v.gep(0).broadcast(4);
        let halves = scaled.cast(DType::vec(Scalar::F16, 4)).cast(DType::vec(Scalar::F32, 4));
        let bits = halves.bitcast(DType::vec(Scalar::U32, 4)).bitcast(DType::vec(Scalar::F32, 4));
        k.store(&b.at_vec(&(&i * 4), 4), &bits);
        let sink = k.finish().unwrap();
        let text = round_trip(&sink);
        for s in ["LOAD f32x4", "GEP f32 3", "VECTORIZE f32x4", "CAST f16x4", "BITCAST u32x4", "INDEX ptr<f32x4>"] {
            assert!(text.contains(s), "{s} missing:\n{text}");
        }
        parse_kernel(&text).unwrap();
    }

    fn float_values() -> Vec<f64> {
        vec![
            0.0,
            -0.0,
            1.0,
            -1.5,
            0.1,
            0.1f32 as f64,
            1e300,
            -2.5e-300,
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            5e-324,
            1e16,
            123456789.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::from_bits(QUIET_NAN),
            f64::from_bits(0xfff8_0000_0000_0000),
            f64::from_bits(0x7ff0_0000_0000_0001),
            f64::from_bits(0x7fff_ffff_ffff_ffff),
            f64::NAN,
            -f64::NAN,
        ]
    }

    #[test]
    fn every_constant_round_trips_bit_exactly() {
        let mut consts = Vec::new();
        for v in float_values() {
            for dt in [DType::F32, DType::F64, DType::F16, DType::Scalar(Scalar::BF16)] {
                consts.push(UOp::const_float(dt, v));
            }
        }
        for v in [0, 1, -1, i64::MIN, i64::MAX, 255] {
            for s in [Scalar::I8, Scalar::I32, Scalar::I64, Scalar::U8, Scalar::U64] {
                consts.push(UOp::const_int(DType::Scalar(s), v));
            }
        }
        consts.push(UOp::const_bool(true));
        consts.push(UOp::const_bool(false));
        let sink = UOp::new(Op::Sink, DType::Void, Arg::None, consts.clone());
        let text = round_trip(&sink);
        // Each constant individually, checking the bits of what comes back.
        for c in &consts {
            let back = parse(&print(c)).unwrap();
            match (c.arg(), back.arg()) {
                (Arg::Float(a), Arg::Float(b)) => assert_eq!(a.to_bits(), b.to_bits()),
                (a, b) => assert_eq!(a, b),
            }
        }
        for s in [
            "CONST f32 -0.0",
            "CONST f64 nan\n",
            "CONST f32 -inf",
            "CONST i64 -9223372036854775808",
            "CONST bool false",
        ] {
            assert!(text.contains(s), "{s} missing:\n{text}");
        }
        assert!(text.contains("nan:0xfff8000000000000"), "{text}");
        assert!(text.contains("CONST f64 1.0\n"), "{text}");
    }

    #[test]
    fn program_with_device_source_and_binary_stages_round_trips() {
        let sink = elementwise();
        let mut stages = Vec::new();
        for (dev, name, bytes) in [
            (DeviceSpec::new("CPU", 0), Arg::Str("add \"v2\"\n\\x".into()), (0..=255u8).collect::<Vec<u8>>()),
            (DeviceSpec::new("CUDA", 1), Arg::None, vec![]),
            (DeviceSpec::new("OPENCL", 0), Arg::Str(String::new()), vec![0x7f, 0x45]),
        ] {
            let device = UOp::new(Op::Device, DType::Void, Arg::Device(dev), vec![]);
            let linear = UOp::new(Op::Linear, DType::Void, Arg::None, linearize(&sink).unwrap());
            let src = "void k(float* a) {\n\ta[0] = 1.0f; // \"quoted\" \\ back\r\n}\0 \u{1} \u{7f} ü 漢 #";
            let source = UOp::new(Op::Source, DType::Void, Arg::Str(src.into()), vec![]);
            let binary = UOp::new(Op::Binary, DType::Void, Arg::Bytes(bytes), vec![]);
            stages.push(UOp::new(Op::Program, DType::Void, name, vec![sink.clone(), device, linear, source, binary]));
        }
        let root = UOp::new(Op::Sink, DType::Void, Arg::None, stages);
        let text = round_trip(&root);
        assert!(text.contains("DEVICE void device CUDA:1"), "{text}");
        assert!(text.contains("BINARY void 0x\n"), "{text}");
        assert!(text.contains("\\u{1} \\u{7f} ü 漢 #\""), "{text}");
        assert_eq!(text.lines().count(), root.toposort().len() + 1, "a string spilled onto another line");
    }

    #[test]
    fn every_op_with_every_accepted_argument_kind_round_trips() {
        let x = UOp::const_int(DType::I32, 3);
        let sample = |k: Kind| match k {
            Kind::None => Arg::None,
            Kind::Int => Arg::Int(-42),
            Kind::Float => Arg::Float(-0.0),
            Kind::Bool => Arg::Bool(true),
            Kind::Str => Arg::Str("a \"b\"\n".into()),
            Kind::Var => Arg::Var { name: "v\t".into(), min: i64::MIN, max: i64::MAX },
            Kind::Device => Arg::Device(DeviceSpec::new("OPENCL", 3)),
            Kind::Bytes => Arg::Bytes(vec![0, 1, 0xfe]),
            Kind::Wmma => Arg::Wmma(Wmma::warp(16, 8, 8, Scalar::F32, Scalar::F32)),
        };
        let dtypes = [
            DType::Void,
            DType::Vector(Scalar::BF16, 64),
            DType::Ptr { scalar: Scalar::U16, width: 8, space: AddrSpace::Local },
        ];
        let mut nodes = Vec::new();
        for &op in Op::ALL {
            for &kind in accepted(op).0 {
                for dt in dtypes {
                    nodes.push(UOp::new(op, dt, sample(kind), vec![]));
                    nodes.push(UOp::new(op, dt, sample(kind), vec![x.clone(), x.clone()]));
                }
            }
        }
        let root = UOp::new(Op::Sink, DType::Void, Arg::None, nodes);
        round_trip(&root);
    }

    /// A one-tile matmul through WMMA: the fragments load as vectors, the op prints with its
    /// shape, dtypes and threads, and the text parses back to the very same graph.
    fn wmma_text(arg: &str, a: &str, b: &str, c: &str) -> String {
        format!(
            "%n = CONST i32 64\n%z = CONST i32 0\n%pa = PARAM ptr<{a_s}> 0 (%n)\n%pb = PARAM ptr<{a_s}> 1 (%n)\n\
             %pc = PARAM ptr<{c_s}> 2 (%n)\n%ia = INDEX ptr<{a}> (%pa, %z)\n%ib = INDEX ptr<{b}> (%pb, %z)\n\
             %ic = INDEX ptr<{c}> (%pc, %z)\n%a = LOAD {a} (%ia)\n%b = LOAD {b} (%ib)\n%c = LOAD {c} (%ic)\n\
             %d = WMMA {c} {arg} (%a, %b, %c)\n%st = STORE (%ic, %d)\nSINK (%st)",
            a_s = a.split('x').next().unwrap_or(a),
            c_s = c.split('x').next().unwrap_or(c),
        )
    }

    #[test]
    fn wmma_round_trips_and_is_validated() {
        let text = wmma_text("m4n16k4 f32 f32 threads 1", "f32x16", "f32x64", "f32x64");
        let sink = parse_kernel(&text).unwrap();
        let printed = round_trip(&sink);
        assert!(printed.contains("WMMA f32x64 m4n16k4 f32 f32 threads 1 ("), "{printed}");
        assert!(Arc::ptr_eq(&parse_kernel(&printed).unwrap(), &sink));
        let warp = parse_kernel(&wmma_text("m16n8k16 bf16 f32 threads 32", "bf16x8", "bf16x4", "f32x4")).unwrap();
        assert!(round_trip(&warp).contains("WMMA f32x4 m16n8k16 bf16 f32 threads 32"));
        // The argument is part of the identity.
        let other = parse_kernel(&wmma_text("m16n8k16 f16 f32 threads 32", "f16x8", "f16x4", "f32x4")).unwrap();
        assert_ne!(warp.content_hash(), other.content_hash());

        for (arg, a, b, c, needle) in [
            (
                "m4n16k4 f32 f32 threads 1",
                "f32x16",
                "f32x32",
                "f32x64",
                "the B fragment of m4n16k4 f32->f32 (1 thread) is f32x64",
            ),
            (
                "m16n8k16 f16 f32 threads 32",
                "f16x8",
                "f16x4",
                "f16x4",
                "expected f32x4 for the result (the D fragment), got f16x4",
            ),
            ("m16n16k16 f16 f32 threads 32", "f16x8", "f16x8", "f32x8", "is not a warp shape of mma.sync"),
            ("m8n8k4 f32 f32 threads 2", "f32x16", "f32x16", "f32x32", "2 threads"),
            ("m8n16k1 f32 f32 threads 1", "f32x8", "f32x16", "f32x64", "needs a 128-lane fragment"),
            ("m4n4k4 i32 i32 threads 1", "i32x16", "i32x16", "i32x16", "not a WMMA dtype pair"),
        ] {
            match parse_kernel(&wmma_text(arg, a, b, c)) {
                Err(IrError::Parse { line: 12, message, .. }) => assert!(message.contains(needle), "{arg}: {message}"),
                other => panic!("{arg}: {other:?}"),
            }
        }
        for (arg, needle) in [
            ("", "WMMA takes shape, input and accumulator dtypes, threads"),
            ("m4n4 f32 f32 threads 1", "`m4n4` is not a shape"),
            ("m4n4k4 f32 float threads 1", "`float` is not a scalar dtype"),
            ("m4n4k4 f32 f32 lanes 1", "expected `threads`"),
            ("m4n4k4 f32 f32 threads -1", "`-1` is not a thread count"),
            ("m4n4k4 f32 f32 threads 1 2", "unexpected text after the thread count"),
            ("m4n4k4 f32 f32", "a WMMA argument is"),
        ] {
            let line = format!("%a = CONST f32 1.0\n%d = WMMA f32 {arg} (%a, %a, %a)");
            match parse(&line) {
                Err(IrError::Parse { line: 2, message, .. }) => assert!(message.contains(needle), "{arg}: {message}"),
                other => panic!("{arg}: {other:?}"),
            }
        }
    }

    /// The tiled matmul example: local memory, barriers and an IF block print, parse back
    /// to the same graph, and linearize into loops and a guarded block in program order.
    #[test]
    fn work_group_kernel_round_trips_and_linearizes_in_blocks() {
        let k = parse_kernel(include_str!("../../../examples/kernels/matmul_tiled.kiln")).unwrap();
        let text = round_trip(&k);
        for needle in ["DEFINE_LOCAL lptr<f32> 1 (", "BARRIER void (", "IF void (", "ENDIF void ("] {
            assert!(text.contains(needle), "{needle}\n{text}");
        }
        let order = linearize(&k).unwrap();
        let blocks: Vec<&str> = order
            .iter()
            .map(|n| n.op())
            .filter(|op| {
                matches!(op, Op::DefineLocal | Op::Range | Op::End | Op::Store | Op::Barrier | Op::If | Op::EndIf)
            })
            .map(Op::name)
            .collect();
        assert_eq!(
            blocks,
            [
                "DEFINE_LOCAL",
                "DEFINE_LOCAL",
                "RANGE",
                "STORE",
                "STORE",
                "BARRIER",
                "RANGE",
                "END",
                "BARRIER",
                "END",
                "IF",
                "STORE",
                "ENDIF"
            ]
        );
    }

    #[test]
    fn validate_numbering_matches_print_numbering() {
        let a = UOp::const_float(DType::F32, 1.0);
        let b = UOp::const_int(DType::I32, 1);
        let bad = UOp::new(Op::Add, DType::F32, Arg::None, vec![a, b]);
        let root = UOp::new(Op::Sink, DType::Void, Arg::None, vec![bad]);
        let Err(IrError::Type { node, op, .. }) = validate(&root) else { panic!("validate accepted a bad ADD") };
        assert_eq!(op, "ADD");
        let text = print(&root);
        let line = text.lines().find(|l| l.starts_with(&format!("%{node} "))).unwrap();
        assert!(line.contains("= ADD f32"), "{line}");
    }

    #[test]
    fn hand_written_text_with_names_comments_and_omitted_void() {
        let text = "# scale by a constant\r\n\
                    %n = DEFINE_VAR i32 \"n\" 1 1024   # elements\r\n\
                    \r\n\
                    %buf\t= PARAM ptr<f32> 0 (%n)\n\
                    %i = SPECIAL i32 \"idx0\" (%n,)\n\
                    %p = INDEX ptr<f32> (%buf, %i)\n\
                    %two = CONST f32 2.0\n\
                    %x.1 = MUL f32 (%two, %two)\n\
                    %st = STORE (%p, %x.1)\n\
                    SINK (%st)  # the root\n";
        let k = parse_kernel(text).unwrap();
        assert_eq!(k.op(), Op::Sink);
        assert_eq!(k.dtype(), DType::Void);
        assert_eq!(k.src()[0].dtype(), DType::Void);
        let again = parse(&print(&k)).unwrap();
        assert!(Arc::ptr_eq(&again, &k));
        // A named root works the same as an unnamed one.
        let named = text.replace("SINK (%st)", "%k = SINK void (%st)");
        assert!(Arc::ptr_eq(&parse(&named).unwrap(), &k));
    }

    #[test]
    fn syntax_errors_point_at_the_offending_token() {
        let cases: &[(&str, usize, usize, &str)] = &[
            ("%a = CONST i32 1\n%b = FOO i32 (%a)\nSINK void (%b)", 2, 6, "unknown op `FOO`"),
            ("%a = CONST i32 1\n%b = LAOD i32 (%a)", 2, 6, "did you mean LOAD?"),
            ("%a = const i32 1", 1, 6, "did you mean CONST?"),
            ("%a = CONST f33 1.0", 1, 12, "unknown dtype `f33`"),
            ("%a = CONST f32x99 1.0", 1, 12, "2..=64"),
            ("%a = CONST i32 1\n%b = NEG i32 (%x)", 2, 15, "undefined %x"),
            ("%b = NEG i32 (%a)\n%a = CONST i32 1", 1, 15, "before its definition on line 2"),
            ("%a = NEG i32 (%a)", 1, 15, "its own definition"),
            ("%a = CONST i32 1\n  %a = CONST i32 2\nSINK (%a)", 2, 3, "already defined on line 1"),
            ("%n = DEFINE_VAR i32 5", 1, 21, "DEFINE_VAR takes name and bounds"),
            ("%n = DEFINE_VAR i32 \"n\" 1 x", 1, 27, "`x` is not an integer"),
            ("%a = CONST f32 1.0\n%b = ADD f32 1.0 (%a, %a)", 2, 14, "ADD takes no argument"),
            ("%p = PARAM ptr<f32> \"a\"", 1, 21, "PARAM takes its slot"),
            ("%n = CONST i32 4\n%i = SPECIAL i32 \"n\" 1 2 (%n)", 2, 18, "got a variable"),
            ("\u{feff}%a = CONST i32 1\n%b = NEG i32 (%q)", 2, 15, "undefined %q"),
            ("%d = DEVICE void device CUDA:x", 1, 25, "ordinal `x` is not a non-negative integer"),
            ("%d = DEVICE void device", 1, 24, "expected a device name"),
            ("%b = BINARY void 0xabc", 1, 18, "even number of hex digits"),
            ("%b = BINARY void 0xzz", 1, 18, "hex digits"),
            ("%c = CONST i64 9223372036854775808", 1, 16, "does not fit in 64 bits"),
            ("%c = CONST f64 1.2.3", 1, 16, "not a number"),
            ("%c = CONST f64 nan:0x3ff0000000000000", 1, 16, "not a NaN bit pattern"),
            ("%c = CONST i32 1 2", 1, 18, "too many arguments"),
            ("%a = CONST i32 1\n%b = NEG i32 (%a", 2, 17, "missing `)`"),
            ("%a = CONST i32 1\n%b = NEG i32 (%a %a)", 2, 18, "expected `,` or `)`"),
            ("%a = CONST i32 1\n%b = NEG i32 (%a) x", 2, 19, "unexpected text"),
            ("%a = CONST i32 1\n%b = NEG i32 %a", 2, 14, "operands go in parentheses"),
            ("%a CONST i32 1", 1, 4, "expected `=`"),
            ("a = CONST i32 1", 1, 1, "start with `%`"),
            ("% = CONST i32 1", 1, 1, "expected a name after `%`"),
            ("%a = ", 1, 5, "expected an op name"),
            ("%a = ADD (%b)", 1, 10, "ADD needs a dtype"),
            ("%s = SOURCE void \"abc", 1, 18, "unterminated string"),
            ("%s = SOURCE void \"a\\qb\"", 1, 20, "unknown escape"),
            ("%s = SOURCE void \"ü漢\" 7", 1, 23, "stands alone"),
            ("%a = CONST i32 1\nCONST i32 2\n%c = CONST i32 3", 2, 1, "only the last line"),
            ("%a = CONST i32 1\n%b = CONST i32 2\nSINK (%b)", 1, 1, "%a is never used"),
            ("", 1, 1, "empty kernel"),
            ("# kiln kernel v1\n\n   # nothing here\n", 1, 1, "empty kernel"),
        ];
        for &(text, line, col, needle) in cases {
            let (l, c, m) = err_at(text);
            assert_eq!((l, c), (line, col), "{text:?}: {m}");
            assert!(m.contains(needle), "{text:?}: `{m}` lacks `{needle}`");
        }
        let (_, _, m) = err_at("%a = SUM f32");
        assert!(m.contains("CMPLT") && !m.contains("upper case"), "the message should list the ops: {m}");
        let (_, _, m) = err_at("%a = load f32");
        assert!(m.contains("did you mean LOAD") && m.contains("upper case"), "{m}");
    }

    #[test]
    fn parse_kernel_reports_validation_errors_at_the_line() {
        let text = "%a = CONST f32 1.0\n%b = CONST i32 2\n%sum = ADD f32 (%a, %b)\n%p = PARAM ptr<f32> 0 (%b)\n\
                    %ix = INDEX ptr<f32> (%p, %b)\n%st = STORE void (%ix, %sum)\nSINK void (%st)\n";
        assert!(parse(text).is_ok(), "parse is purely syntactic");
        match parse_kernel(text) {
            Err(IrError::Parse { line: 3, col: 8, message }) => {
                assert!(message.starts_with("%sum = ADD: operands have different dtypes"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        let int_for_float = "%c = CONST f32 1\n%p = PARAM ptr<f32> 0 (%n)\n%n = CONST i32 4";
        assert_eq!(err_at(int_for_float).0, 2);
        let int_for_float = "%n = CONST i32 4\n%p = PARAM ptr<f32> 0 (%n)\n%c = CONST f32 1\n\
                             %ix = INDEX ptr<f32> (%p, %n)\n%st = STORE (%ix, %c)\nSINK (%st)";
        match parse_kernel(int_for_float) {
            Err(IrError::Parse { line: 3, message, .. }) => assert!(message.contains("floats 7.0"), "{message}"),
            other => panic!("{other:?}"),
        }
        let unclosed = "%n = CONST i32 4\n%p = PARAM ptr<f32> 0 (%n)\n%r = RANGE i32 0 (%n)\n\
                        %ix = INDEX ptr<f32> (%p, %r)\n%v = CONST f32 0.0\n%st = STORE (%ix, %v)\nSINK (%st)";
        match parse_kernel(unclosed) {
            Err(IrError::Structure(m)) => assert!(m.contains("%r (line 3)"), "{m}"),
            other => panic!("{other:?}"),
        }
        match parse_kernel("%c = CONST i32 1") {
            Err(IrError::Parse { line: 1, col: 6, message }) => assert!(message.contains("SINK"), "{message}"),
            other => panic!("{other:?}"),
        }
    }

    use crate::test_rng::Rng;

    /// Whatever `parse` returns for `text` must be sensible: an error with a real position,
    /// or a graph that itself round-trips.
    fn check_outcome(text: &str) -> bool {
        let lines = text.lines().count().max(1);
        match parse(text) {
            Ok(root) => {
                assert!(Arc::ptr_eq(&parse(&print(&root)).unwrap(), &root), "{text:?}");
                let _ = parse_kernel(text);
                true
            }
            Err(IrError::Parse { line, col, message }) => {
                assert!((1..=lines).contains(&line) && col >= 1 && !message.is_empty(), "{line}:{col} {text:?}");
                false
            }
            Err(other) => panic!("parse returned a non-Parse error {other:?} for {text:?}"),
        }
    }

    #[test]
    fn mutated_and_truncated_input_never_panics() {
        let seeds = [print(&elementwise()), print(&matmul()), {
            let src = UOp::new(Op::Source, DType::Void, Arg::Str("a\"\\\n".into()), vec![]);
            let dev = UOp::new(Op::Device, DType::Void, Arg::Device(DeviceSpec::new("CPU", 0)), vec![]);
            let bin = UOp::new(Op::Binary, DType::Void, Arg::Bytes(vec![1, 2, 3]), vec![]);
            print(&UOp::new(Op::Program, DType::Void, Arg::Str("p".into()), vec![dev, src, bin]))
        }];
        let mut oks = 0;
        for seed in &seeds {
            for (cut, _) in seed.char_indices() {
                oks += check_outcome(&seed[..cut]) as usize;
            }
        }
        let alphabet: Vec<char> = "%=(),#\"\\ \n\t0123456789.-+exnaifuptr<>CONSTADDvoid:漢\u{0}".chars().collect();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for round in 0..3000 {
            let mut chars: Vec<char> = seeds[round % seeds.len()].chars().collect();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(chars.len() + 1);
                match rng.below(4) {
                    0 if at < chars.len() => {
                        chars.remove(at);
                    }
                    1 if at < chars.len() => chars[at] = alphabet[rng.below(alphabet.len())],
                    2 => chars.insert(at, alphabet[rng.below(alphabet.len())]),
                    _ => {
                        // Duplicate a slice somewhere else (repeats lines, names and tokens).
                        let from = rng.below(chars.len());
                        let len = rng.below(40).min(chars.len() - from);
                        let piece: Vec<char> = chars[from..from + len].to_vec();
                        let to = rng.below(chars.len() + 1);
                        chars.splice(to..to, piece);
                    }
                }
            }
            let text: String = chars.into_iter().collect();
            oks += check_outcome(&text) as usize;
        }
        for _ in 0..500 {
            let text: String = (0..rng.below(80)).map(|_| alphabet[rng.below(alphabet.len())]).collect();
            check_outcome(&text);
        }
        assert!(oks > 0, "no mutation parsed at all: the fuzz is not exercising the happy path");
    }
}
