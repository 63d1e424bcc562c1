//! The code stays in rooms a newcomer can read: no non-test source file
//! over `MAX_LINES`, except the files below, which were larger when the
//! limit came and may only shrink (a ratchet: take a file off the list
//! once it is under the limit).

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 600;

/// Files over the limit, and the most lines each may have.
const OVER_THE_LIMIT: &[(&str, usize)] = &[
];

/// Test code and generated code are not counted (`path` is relative to
/// the workspace root).
fn counted(path: &Path) -> bool {
    let text = path.to_string_lossy();
    path.extension().is_some_and(|ext| ext == "rs")
        && !path
            .components()
            .any(|c| matches!(c.as_os_str().to_str(), Some("tests" | "gen" | "target" | "e2e")))
        && !text.ends_with("tests.rs")
        && !text.ends_with("_tests.rs")
}

fn sources(root: &Path, dir: &Path, into: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') || name == "target" {
            continue;
        }
        let relative = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
        if path.is_dir() {
            sources(root, &path, into);
        } else if counted(&relative) {
            into.push(relative);
        }
    }
}

#[test]
fn no_source_file_outgrows_the_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the workspace root");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    assert!(
        files.len() > 50,
        "found only {} source files under {}",
        files.len(),
        root.display()
    );
    let mut wrong = Vec::new();
    for path in files {
        let relative = path.to_string_lossy().replace('\\', "/");
        let lines = std::fs::read_to_string(root.join(&path))
            .map(|text| text.lines().count())
            .unwrap_or(0);
        match OVER_THE_LIMIT.iter().find(|(listed, _)| *listed == relative) {
            Some((_, most)) if lines > *most => wrong.push(format!(
                "{relative}: {lines} lines, more than the {most} it may have: split it (see ARCHITECTURE.md)"
            )),
            Some(_) if lines <= MAX_LINES => wrong.push(format!(
                "{relative}: {lines} lines, under {MAX_LINES} now: take it off OVER_THE_LIMIT"
            )),
            None if lines > MAX_LINES => wrong.push(format!(
                "{relative}: {lines} lines, over {MAX_LINES}: split it into files of one purpose"
            )),
            _ => {}
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
