//! docs/architecture.md names every module file of the daemon, and no file the daemon does
//! not have: a module cannot land, move or go without its line there changing too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, by its path relative to `root`.
fn module_files(root: &Path, dir: &Path, found: &mut BTreeSet<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            module_files(root, &path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let relative = path.strip_prefix(root).expect("under the root");
            found.insert(relative.to_string_lossy().into_owned());
        }
    }
}

/// The module files the document names: every `` `name.rs` `` or `` `dir/name.rs` ``.
fn named_files(doc: &str) -> BTreeSet<String> {
    doc.split('`')
        .skip(1)
        .step_by(2)
        .filter(|quoted| {
            quoted.ends_with(".rs")
                && quoted
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_/.".contains(c))
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_architecture_doc_names_every_module_file_and_no_other() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let doc_path = manifest.join("../docs/architecture.md");
    let doc = std::fs::read_to_string(&doc_path)
        .unwrap_or_else(|e| panic!("{}: {e}", doc_path.display()));
    let src = manifest.join("src");
    let mut files = BTreeSet::new();
    module_files(&src, &src, &mut files);
    let named = named_files(&doc);
    let missing: Vec<&String> = files.difference(&named).collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md does not name {missing:?}: give each a line under \"The daemon's modules\""
    );
    let gone: Vec<&String> = named.difference(&files).collect();
    assert!(
        gone.is_empty(),
        "docs/architecture.md names {gone:?}, which liveness-daemon/src does not have"
    );
}

/// The names `lib.rs` re-exports: the last segment of each `pub use`, or each name in its
/// braces.
fn exports(lib: &str) -> BTreeSet<String> {
    lib.split(';')
        .filter_map(|statement| statement.trim().strip_prefix("pub use "))
        .flat_map(|path| {
            let names = match path.split_once('{') {
                Some((_, inner)) => inner.trim_end_matches('}').to_owned(),
                None => path.rsplit("::").next().unwrap_or(path).to_owned(),
            };
            names
                .split(',')
                .map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn the_architecture_doc_names_every_export_of_the_library() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(manifest.join("../docs/architecture.md")).unwrap();
    let lib = std::fs::read_to_string(manifest.join("src/lib.rs")).unwrap();
    let paragraph = doc
        .split("\n\n")
        .find(|paragraph| paragraph.starts_with("The daemon's library exposes"))
        .expect("docs/architecture.md has a paragraph on the library's exports");
    let exported = exports(&lib);
    assert!(
        exported.contains("Store"),
        "exports read from lib.rs: {exported:?}"
    );
    let missing: Vec<&String> = exported
        .iter()
        .filter(|name| !paragraph.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md's paragraph on the library's exports does not name {missing:?}"
    );
}
