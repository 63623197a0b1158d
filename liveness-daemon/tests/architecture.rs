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

/// The calls that signal, wait for or open a process by its number or by a bare pidfd.
/// Outside liveness-proc each goes through its `PidRef`, which verified the pidfd first: a
/// pid that passed to another process is then never signalled or waited for.
const PROCESS_CALLS: [&str; 7] = [
    "pidfd_send_signal",
    "pidfd_open",
    "kill_process",
    "libc::kill",
    "tgkill",
    "waitid",
    "waitpid",
];

/// The crates that ship, but for liveness-proc, which holds `PidRef`.
const PRODUCTION_CRATES: [&str; 4] = [
    "liveness-common",
    "liveness-client",
    "liveness-cli",
    "liveness-daemon",
];

/// `source` with its comments, string literals and character literals blanked (newlines
/// kept), so that only code is searched.
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let blank = |out: &mut String, from: &[char]| {
        out.extend(from.iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
    };
    while i < chars.len() {
        let rest = &chars[i..];
        let ident_before = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        let end = if rest.starts_with(&['/', '/']) {
            rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
        } else if rest.starts_with(&['/', '*']) {
            let mut depth = 0;
            let mut j = 0;
            while j < rest.len() {
                if rest[j..].starts_with(&['/', '*']) {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(&['*', '/']) {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            j
        } else if rest[0] == 'r'
            && !ident_before
            && rest[1..]
                .iter()
                .position(|&c| c != '#')
                .map(|h| rest[1 + h])
                == Some('"')
        {
            let hashes = rest[1..].iter().take_while(|&&c| c == '#').count();
            let close: Vec<char> = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body = 2 + hashes;
            body + (body..rest.len())
                .find(|&j| rest[j..].starts_with(&close))
                .map_or(rest.len() - body, |j| j - body + close.len())
        } else if rest[0] == '"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != '"' {
                j += if rest[j] == '\\' { 2 } else { 1 };
            }
            (j + 1).min(rest.len())
        } else if rest[0] == '\'' && rest.get(1) == Some(&'\\') {
            2 + rest[2..]
                .iter()
                .position(|&c| c == '\'')
                .map_or(0, |j| j + 1)
        } else if rest[0] == '\'' && rest.get(2) == Some(&'\'') {
            3
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        blank(&mut out, &rest[..end]);
        i += end;
    }
    out
}

/// `code` without its `#[cfg(test)]` items, and the names of the modules declared under
/// that attribute in files of their own (`#[cfg(test)] mod tests;`).
fn without_tests(code: &str) -> (String, Vec<String>) {
    let mut kept = String::with_capacity(code.len());
    let mut test_modules = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        kept.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        let (end, body) = match (item.find(';'), item.find('{')) {
            (Some(semi), brace) if brace.is_none_or(|brace| semi < brace) => (semi + 1, false),
            (_, Some(brace)) => {
                let mut depth = 0;
                let close = item[brace..]
                    .char_indices()
                    .find(|&(_, c)| {
                        depth += match c {
                            '{' => 1,
                            '}' => -1,
                            _ => 0,
                        };
                        depth == 0
                    })
                    .map_or(item.len(), |(j, _)| brace + j + 1);
                (close, true)
            }
            _ => (item.len(), true),
        };
        if !body {
            let words: Vec<&str> = item[..end - 1].split_whitespace().collect();
            if let [.., "mod", name] = words.as_slice() {
                test_modules.push((*name).to_owned());
            }
        }
        rest = &item[end..];
    }
    kept.push_str(rest);
    (kept, test_modules)
}

/// The process calls in the production code of the `.rs` files under `dir`, as
/// `path: call`; modules declared for tests only are left out with their files.
fn process_calls(dir: &Path, found: &mut Vec<String>) {
    let mut files: Vec<PathBuf> = Vec::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            dirs.push(path);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    let mut skipped: Vec<PathBuf> = Vec::new();
    for path in &files {
        let source = std::fs::read_to_string(path).unwrap();
        let (code, test_modules) = without_tests(&code_only(&source));
        // `mod x;` in lib.rs, main.rs or mod.rs is x.rs beside it, else under a directory
        // named after its file.
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let base = match stem.as_str() {
            "lib" | "main" | "mod" => dir.to_path_buf(),
            _ => dir.join(&stem),
        };
        for name in test_modules {
            skipped.push(base.join(format!("{name}.rs")));
            skipped.push(base.join(&name));
        }
        for call in PROCESS_CALLS {
            if code.contains(call) {
                found.push(format!("{}: {call}", path.display()));
            }
        }
    }
    found.retain(|hit| {
        !skipped
            .iter()
            .any(|skip| hit.starts_with(&format!("{}:", skip.display())))
    });
    for sub in dirs {
        if !skipped.contains(&sub) {
            process_calls(&sub, found);
        }
    }
}

#[test]
fn no_production_code_outside_liveness_proc_signals_or_waits_by_itself() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest.parent().expect("the workspace");
    let mut found = Vec::new();
    for krate in PRODUCTION_CRATES {
        process_calls(&workspace.join(krate).join("src"), &mut found);
    }
    assert!(
        found.is_empty(),
        "signal, wait for or open processes through liveness_proc::pidref::PidRef, not directly: {found:?}"
    );
}

#[test]
fn the_search_sees_calls_in_code_only() {
    let source = r##"
        // libc::kill(pid, 9) in a comment
        /* waitid( in /* a nested */ block */
        const NAME: &str = "pidfd_open(2)";
        const RAW: &str = r#"kill_process"#;
        const QUOTE: char = '"';
        fn f<'a>(x: &'a u8) { rustix::process::pidfd_send_signal(fd, s); }
        #[cfg(test)]
        mod tests { fn t() { unsafe { libc::waitpid(1, p, 0) }; } }
        #[cfg(test)]
        mod fake;
    "##;
    let (code, test_modules) = without_tests(&code_only(source));
    let seen: Vec<&str> = PROCESS_CALLS
        .into_iter()
        .filter(|call| code.contains(call))
        .collect();
    assert_eq!(seen, ["pidfd_send_signal"], "{code}");
    assert_eq!(test_modules, ["fake"]);
}
