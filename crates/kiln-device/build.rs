//! Exports `KILN_SOURCE_ID`: a hash of the source of every crate whose code decides what a
//! renderer makes of a kernel (the IR passes, the C-family emitter, the backends). The kernel
//! cache keys a renderer's kernels by it (see `Toolchain::kernel_key`), so a binary built by an
//! older kiln is never loaded for a kernel a newer one would render differently, without a
//! version constant to forget to bump. Outside this workspace (a crate from a registry) the
//! sibling crates are absent and the crates' versions stand for their source.

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;
use std::path::{Path, PathBuf};

/// The crates whose source takes part in rendering a kernel.
const RENDERING_CRATES: &[&str] =
    &["kiln-ir", "kiln-cstyle", "kiln-device", "kiln-cpu", "kiln-opencl", "kiln-cuda", "kiln-webgpu"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let crates = manifest.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut h = DefaultHasher::new();
    h.write(env!("CARGO_PKG_VERSION").as_bytes());
    for name in RENDERING_CRATES {
        let src = crates.join(name).join("src");
        if !src.is_dir() {
            continue;
        }
        println!("cargo:rerun-if-changed={}", src.display());
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        files.sort();
        for file in files {
            h.write(file.strip_prefix(&crates).unwrap_or(&file).to_string_lossy().as_bytes());
            h.write(&std::fs::read(&file).unwrap_or_default());
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=KILN_SOURCE_ID={:016x}", h.finish());
}
