//! `docs/architecture.md`'s crate table stays in step with the workspace: it names every
//! crate under `crates/`, and only those.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The crates the first column of the table under `## Crates` names (up to the next heading).
fn documented(doc: &str) -> BTreeSet<String> {
    let section = doc.split("\n## Crates\n").nth(1).unwrap_or_default();
    let section = section.split("\n#").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .flat_map(|row| {
            let first = row.split(" |").next().unwrap_or_default();
            first.split(", ").map(|name| name.trim_matches('`').to_string()).collect::<Vec<_>>()
        })
        .collect()
}

/// The package name of every crate under `crates/`.
fn members(root: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in fs::read_dir(root.join("crates")).expect("the workspace's crates folder") {
        let Ok(manifest) = fs::read_to_string(entry.expect("a crates/ entry").path().join("Cargo.toml")) else {
            continue;
        };
        let name = manifest.lines().find_map(|l| l.strip_prefix("name = \"")).and_then(|l| l.strip_suffix('"'));
        names.insert(name.expect("every crate's manifest names its package first").to_string());
    }
    names
}

#[test]
fn the_architecture_docs_crate_table_names_every_workspace_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let doc = fs::read_to_string(root.join("docs/architecture.md")).expect("docs/architecture.md");
    let (table, crates) = (documented(&doc), members(&root));
    assert!(crates.len() >= 10, "{crates:?}");
    assert_eq!(table, crates, "docs/architecture.md's crate table against the crates under crates/");
}
