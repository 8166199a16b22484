//! [`Toolchain`]: a device pair's renderer, compiler and loader, and the identity that keys
//! its kernels in memory and on disk.

use std::sync::Arc;

use kiln_ir::UOp;
use sha2::{Digest, Sha256};

use super::FORMAT_VERSION;
use crate::kernel::Loader;
use crate::parts::CompilerPair;
use crate::program::{Compiler, Renderer};

/// A renderer, compiler and loader, with the identity of everything besides the kernel that
/// decides the compiled bytes. Build it once per device: the fingerprint is taken here.
pub struct Toolchain {
    /// Turns kernels into source for the backend; the source is part of the disk key.
    pub renderer: Arc<dyn Renderer>,
    /// Turns source into binaries; its `cache_key()` and `fingerprint()` are part of the
    /// disk key, taken once in [`Toolchain::new`].
    pub compiler: Arc<dyn Compiler>,
    /// Loads compiled bytes into a kernel of the device.
    pub loader: Loader,
    fingerprint: String,
    pub(super) id: [u8; 32],
}

impl std::fmt::Debug for Toolchain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Toolchain({} [{}])", self.compiler.cache_key(), self.fingerprint)
    }
}

/// A hash of the source of kiln's rendering crates, taken by `build.rs`.
const SOURCE_ID: &str = env!("KILN_SOURCE_ID");

fn put_str(h: &mut Sha256, s: &str) {
    h.update((s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

impl Toolchain {
    /// Bundles the three stages and takes the compiler's fingerprint now, once: a toolchain
    /// changed after this (a new compiler binary) is seen only by a new `Toolchain`. The
    /// renderer is not part of the identity: its output is (see [`Toolchain::disk_key`]), and
    /// a device renders every kernel with one renderer.
    pub fn new(renderer: Arc<dyn Renderer>, compiler: Arc<dyn Compiler>, loader: Loader) -> Toolchain {
        Toolchain::identified(renderer, compiler, loader, None)
    }

    /// The toolchain of a device's compiler pair: as [`Toolchain::new`], with the pair's name
    /// in its identity, so that two pairs of one device (which may share a compiler and differ
    /// in their renderers) never share a memory-cache entry.
    pub fn of_pair(pair: &CompilerPair, loader: Loader) -> Toolchain {
        Toolchain::identified(pair.renderer.clone(), pair.compiler.clone(), loader, Some(&pair.name))
    }

    fn identified(
        renderer: Arc<dyn Renderer>,
        compiler: Arc<dyn Compiler>,
        loader: Loader,
        pair: Option<&str>,
    ) -> Toolchain {
        let fingerprint = compiler.fingerprint();
        let mut h = Sha256::new();
        put_str(&mut h, compiler.cache_key());
        put_str(&mut h, &fingerprint);
        if let Some(pair) = pair {
            put_str(&mut h, pair);
        }
        Toolchain { renderer, compiler, loader, fingerprint, id: h.finalize().into() }
    }

    /// The disk key of `sink` compiled under `name` for the device family `family` by a
    /// renderer whose [`Renderer::identity`] is `identity`: without its source, which kiln's
    /// own source (`KILN_SOURCE_ID`, taken by the build) and the identity decide.
    pub fn kernel_key(&self, sink: &UOp, name: Option<&str>, family: &str, identity: &str) -> [u8; 32] {
        self.key(b"kiln-kernel-by-identity\0", sink, name, family, &[SOURCE_ID, identity])
    }

    /// The disk key of `sink` compiled under `name` for the device family `family`.
    /// The disk key also covers the rendered source, so a renderer change can never load a
    /// binary built from older output (no version constant to forget to bump).
    pub fn disk_key(&self, sink: &UOp, name: Option<&str>, family: &str, src: &str) -> [u8; 32] {
        self.key(b"kiln-kernel-cache\0", sink, name, family, &[src])
    }

    fn key(&self, domain: &[u8], sink: &UOp, name: Option<&str>, family: &str, rest: &[&str]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(domain);
        h.update(FORMAT_VERSION.to_le_bytes());
        h.update(sink.content_hash().0);
        match name {
            Some(n) => {
                h.update([1]);
                put_str(&mut h, n);
            }
            None => h.update([0]),
        }
        put_str(&mut h, family);
        put_str(&mut h, self.compiler.cache_key());
        put_str(&mut h, &self.fingerprint);
        for part in rest {
            put_str(&mut h, part);
        }
        h.finalize().into()
    }
}
