//! The code stays in rooms a newcomer can read: no non-test source file
//! over `MAX_LINES`, except the files below, which were larger when the
//! limit came and may only shrink (a ratchet: take a file off the list
//! once it is under the limit).

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 600;

/// Files over the limit, and the most lines each may have.
const OVER_THE_LIMIT: &[(&str, usize)] = &[];

/// Test code, generated code and vendored crates are not counted (`path`
/// is relative to the workspace root).
fn counted(path: &Path) -> bool {
    let text = path.to_string_lossy();
    path.extension().is_some_and(|ext| ext == "rs")
        && !path.components().any(|c| {
            matches!(
                c.as_os_str().to_str(),
                Some("tests" | "gen" | "target" | "e2e" | "vendor")
            )
        })
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

/// The workspace root and its counted source files (relative paths).
fn counted_sources() -> (PathBuf, Vec<PathBuf>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the workspace root");
    let mut files = Vec::new();
    sources(&root, &root, &mut files);
    (root, files)
}

#[test]
fn no_source_file_outgrows_the_limit() {
    let (root, files) = counted_sources();
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

/// Most lines a function may have, unless a `// Long by design:` comment
/// right above it (among its doc comments and attributes) says why.
const MAX_FN_LINES: usize = 80;

/// The indentation of a line that starts a function with a body (not a
/// trait method's declaration, nor a one-line function).
fn function_start(line: &str) -> Option<usize> {
    let indent = line.len() - line.trim_start().len();
    let mut rest = line.trim_start();
    loop {
        let before = rest;
        for prefix in [
            "pub(crate) ",
            "pub(super) ",
            "pub(in crate::state) ",
            "pub ",
            "async ",
            "const ",
            "unsafe ",
            "extern \"C\" ",
        ] {
            rest = rest.strip_prefix(prefix).unwrap_or(rest);
        }
        if rest == before {
            break;
        }
    }
    let one_line_or_declaration = line.trim_end().ends_with(';') || line.trim_end().ends_with('}');
    (rest.starts_with("fn ") && !one_line_or_declaration).then_some(indent)
}

/// Whether the comments and attributes right above line `at` say why the
/// function there is long.
fn says_why_it_is_long(lines: &[&str], at: usize) -> bool {
    lines[..at]
        .iter()
        .rev()
        .map(|line| line.trim_start())
        .take_while(|line| line.starts_with("//") || line.starts_with("#["))
        .any(|line| line.starts_with("// Long by design:"))
}

#[test]
fn no_function_outgrows_the_limit_without_saying_why() {
    let (root, files) = counted_sources();
    let mut long = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(root.join(&path)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for (at, line) in lines.iter().enumerate() {
            // An inline test module is test code: the rest of the file.
            if line.starts_with("#[cfg(test)]") && lines.get(at + 1).is_some_and(|next| next.ends_with('{')) {
                break;
            }
            let Some(indent) = function_start(line) else {
                continue;
            };
            let close = format!("{}}}", " ".repeat(indent));
            let Some(end) = (at + 1..lines.len()).find(|end| lines[*end].trim_end() == close) else {
                continue;
            };
            let n_lines = end - at + 1;
            if n_lines > MAX_FN_LINES && !says_why_it_is_long(&lines, at) {
                long.push(format!(
                    "{}:{}: {} lines: split it into named steps, or say why not with a `// Long by design:` comment above it",
                    path.display(),
                    at + 1,
                    n_lines
                ));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_function_scan_sees_long_functions_and_their_reasons() {
    let body = |n: usize| "    let x = 1;\n".repeat(n);
    let long = format!("/// Does it.\nfn long() {{\n{}}}\n", body(85));
    let lines: Vec<&str> = long.lines().collect();
    assert_eq!(function_start(lines[1]), Some(0));
    assert!(!says_why_it_is_long(&lines, 1));
    let said = format!(
        "/// Does it.\n// Long by design: one arm per case.\npub(crate) fn long() {{\n{}}}\n",
        body(85)
    );
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(function_start(lines[2]), Some(0));
    assert!(says_why_it_is_long(&lines, 2));
    assert_eq!(function_start("    fn short(&self) -> u32 { 5 }"), None);
    assert_eq!(function_start("    fn declared(&self) -> u32;"), None);
    assert_eq!(function_start("    pub async fn run("), Some(4));
}
