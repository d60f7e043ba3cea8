//! The source layout's two rules, checked on the source itself so that they hold by construction
//! rather than by review: dependencies point down the layers `docs/design.md` draws, with no circle
//! between modules, and no file has more than 500 lines of code.
//!
//! The layers are read from design.md's diagram (its "Layers" section), so the picture a reader
//! sees and the rule the build enforces are the same text. A module that is not in the picture
//! fails the test: a new module is placed on purpose, not by accident.
//!
//! A dependency is a `crate::` (or `super::`) path in the library's code, outside comments and test
//! modules, re-exports included: a façade — a module that gathers other modules' types under one
//! public name, as `marker` does — depends on what it gathers, so it sits above all of it. (A path
//! that reaches a type through a façade counts as a dependency on the façade.) Within one line of
//! the diagram, modules may use each other as long as no circle forms, which design.md says too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most lines of code (not blank, not a comment line) one source file may have.
const MAX_LINES_OF_CODE: usize = 500;

fn root() -> PathBuf {
    crate::common::repository()
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The module path of a file under `src/` (`src/record/file/disk.rs` is `record::file::disk`;
/// `mod.rs` names its directory; `lib.rs` is the root, `main.rs` the module `main`).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if !(stem == "mod" || (parts.is_empty() && stem == "lib")) {
        parts.push(stem.to_string());
    }
    parts
}

/// Whether a file holds only tests (`tests.rs`, or anything under a `tests/` directory).
fn is_test_file(relative: &Path) -> bool {
    relative.iter().any(|p| p == "tests" || p == "tests.rs")
}

/// The layers of design.md's diagram, top first: each a set of top-level modules.
fn layers_of_design() -> Vec<(String, BTreeSet<String>)> {
    let design = std::fs::read_to_string(root().join("docs/design.md")).expect("docs/design.md");
    let section = design
        .split("\n## Layers\n")
        .nth(1)
        .expect("design.md has a \"## Layers\" section");
    let block = section
        .split("```")
        .nth(1)
        .expect("the Layers section opens with a diagram in a ``` block");
    let mut layers = Vec::new();
    // A line that starts with a space continues the description above it.
    for line in block
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty() && !l.starts_with(' '))
    {
        // The first column (the modules) ends where two spaces begin the description.
        let names = line.split("  ").next().unwrap_or_default();
        let modules: BTreeSet<String> = names
            .split([',', '+'])
            .map(|n| n.trim().trim_end_matches('/').trim_end_matches(".rs"))
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        assert!(
            !modules.is_empty(),
            "a diagram line names no module: {line:?}"
        );
        layers.push((names.trim().to_string(), modules));
    }
    assert!(
        layers.len() >= 3,
        "design.md's diagram has too few layers: {layers:?}"
    );
    layers
}

/// The code of a file as the compiler sees the library: comment lines and inline test modules
/// removed.
fn library_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("//") {
            continue;
        }
        if trimmed.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod tests {"))
        {
            // Skip the module to its closing brace, counting braces (format strings' `{}` are
            // balanced, and the test modules hold no lone brace in a char literal).
            let mut depth = 0i64;
            let mut opened = false;
            for inner in lines.by_ref() {
                for c in inner.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if opened && depth == 0 {
                    break;
                }
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifier at the start of `text`.
fn ident(text: &str) -> &str {
    let end = text.find(|c: char| !is_ident_char(c)).unwrap_or(text.len());
    &text[..end]
}

/// The top-level modules the code of the module at `path` names through `crate::` and `super::`.
fn dependencies(code: &str, path: &[String]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for keyword in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(found) = code[from..].find(keyword) {
            let at = from + found;
            from = at + keyword.len();
            // `$crate::` is the crate too; `mycrate::` or `x.super` are not ours.
            if code[..at].chars().next_back().is_some_and(is_ident_char) {
                continue;
            }
            // The absolute path the reference starts from.
            let mut base: Vec<String> = Vec::new();
            let mut rest = &code[from..];
            if keyword == "super::" {
                base = path.to_vec();
                base.pop();
                while let Some(more) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = more;
                }
            }
            if let Some(top) = base.first() {
                out.insert(top.clone());
                continue;
            }
            // From the root: one module, or a braced group of them.
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 1;
                let mut expect_name = true;
                for (i, c) in group.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        ',' if depth == 1 => expect_name = true,
                        c if c.is_whitespace() => {}
                        _ if expect_name && depth == 1 => {
                            out.insert(ident(&group[i..]).to_string());
                            expect_name = false;
                        }
                        _ => {}
                    }
                }
            } else {
                let name = ident(rest);
                if !name.is_empty() {
                    out.insert(name.to_string());
                }
            }
        }
    }
    out
}

/// Each top-level module and the top-level modules its library code depends on.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    // Both library crates: their module names differ, and the framework names the protocol's
    // modules as its own (`use planned_stop_protocol::{store, ..}` at its root).
    for src in LIBRARY_SOURCES.map(|dir| root().join(dir)) {
        add_modules(&src, &mut graph);
    }
    graph
}

/// The library crates' sources: the actix framework and the protocol below it.
const LIBRARY_SOURCES: [&str; 2] = ["src", "protocol/src"];

/// Every published library's sources: the layers' two, and the PostgreSQL store over them (a store
/// of its own crate; its modules are not the framework's layers, its messages are the library's).
const PUBLISHED_LIBRARIES: [&str; 3] = ["src", "protocol/src", "postgres/src"];

/// Adds the top-level modules of the crate whose sources are `src` to `graph`.
fn add_modules(src: &Path, graph: &mut BTreeMap<String, BTreeSet<String>>) {
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).expect("under src");
        let path = module_path(relative);
        let Some(top) = path.first().cloned() else {
            continue; // lib.rs: the root declares and re-exports, it is no layer
        };
        let deps = graph.entry(top.clone()).or_default();
        if is_test_file(relative) {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("a source file");
        for dep in dependencies(&library_code(&text), &path) {
            // Items of the root itself (`crate::Drain`) are re-exports of a module; `self`
            // and the crate's own name are not modules.
            if dep != top && dep != "self" && !dep.is_empty() {
                deps.insert(dep);
            }
        }
    }
}

/// A circle in `graph`, if there is one, as the modules along it.
fn find_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, bool>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), false);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next) {
                Some(false) => {
                    let start = stack.iter().position(|n| n == next).expect("on the stack");
                    let mut circle = stack[start..].to_vec();
                    circle.push(next.clone());
                    return Some(circle);
                }
                Some(true) => {}
                None => {
                    if let Some(circle) = visit(next, graph, state, stack) {
                        return Some(circle);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), true);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node) {
            let mut stack = Vec::new();
            if let Some(circle) = visit(node, graph, &mut state, &mut stack) {
                return Some(circle);
            }
        }
    }
    None
}

/// The dependencies in `graph` that point up `layers` (the top layer first), each said as a
/// sentence. Within one layer is not up.
fn upward(
    layers: &[(String, BTreeSet<String>)],
    graph: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let layer_of = |module: &str| layers.iter().position(|(_, m)| m.contains(module));
    let mut upward = Vec::new();
    for (module, deps) in graph {
        for dep in deps {
            let (Some(from), Some(to)) = (layer_of(module), layer_of(dep)) else {
                continue; // a dependency that is not a module of ours (an item of the root)
            };
            if to < from {
                upward.push(format!(
                    "{module} (layer \"{}\") uses {dep} (layer \"{}\")",
                    layers[from].0, layers[to].0
                ));
            }
        }
    }
    upward
}

#[test]
fn dependencies_point_down_the_layers_of_design_md() {
    let layers = layers_of_design();
    let graph = module_graph();
    let layer_of = |module: &str| layers.iter().position(|(_, m)| m.contains(module));

    let unplaced: Vec<_> = graph.keys().filter(|m| layer_of(m).is_none()).collect();
    assert!(
        unplaced.is_empty(),
        "modules not in design.md's layer diagram (place each in its layer): {unplaced:?}"
    );
    let drawn: BTreeSet<&String> = layers.iter().flat_map(|(_, m)| m).collect();
    let stale: Vec<_> = drawn.iter().filter(|m| !graph.contains_key(**m)).collect();
    assert!(
        stale.is_empty(),
        "design.md's layer diagram names modules that do not exist: {stale:?}"
    );

    let upward = upward(&layers, &graph);
    assert!(
        upward.is_empty(),
        "dependencies that point up design.md's layers:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_circle_between_modules() {
    let graph = module_graph();
    // Only edges between modules of ours (an item of the root, `crate::Drain`, is not a module).
    let graph: BTreeMap<String, BTreeSet<String>> = graph
        .iter()
        .map(|(m, deps)| {
            let ours = deps.iter().filter(|d| graph.contains_key(*d)).cloned();
            (m.clone(), ours.collect())
        })
        .collect();
    if let Some(circle) = find_circle(&graph) {
        panic!("a circle between modules: {}", circle.join(" -> "));
    }
}

#[test]
fn no_source_file_has_more_than_500_lines_of_code() {
    let mut over = Vec::new();
    let sources = [
        "src",
        "protocol/src",
        "postgres/src",
        "cli/src",
        "harness/src",
    ]
    .map(|dir| root().join(dir));
    for file in sources.iter().flat_map(|dir| rust_files(dir)) {
        let text = std::fs::read_to_string(&file).expect("a source file");
        let code = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .count();
        if code > MAX_LINES_OF_CODE {
            over.push(format!("{}: {code}", file.display()));
        }
    }
    assert!(
        over.is_empty(),
        "files over {MAX_LINES_OF_CODE} lines of code (split them by concept): {over:?}"
    );
}

/// The checks themselves, on made-up code: each must see what it exists to see.
#[test]
fn the_checks_see_paths_groups_supers_and_circles() {
    let path = |p: &str| p.split("::").map(str::to_string).collect::<Vec<_>>();
    let code = "use crate::{record::Item, store::{a, b}, lifecycle};\n\
                fn f() { crate::outcome::x(); $crate::clock::now(); mycrate::nope(); }";
    let found = dependencies(code, &path("runner::drain"));
    let expected: BTreeSet<String> = ["clock", "lifecycle", "outcome", "record", "store"]
        .map(String::from)
        .into();
    assert_eq!(found, expected);
    // `super` from a nested file stays in its module; from a top-level file it is the root's
    // module named after it.
    assert_eq!(
        dependencies("use super::super::x::Y;", &path("record::file::disk")),
        BTreeSet::from(["record".to_string()])
    );
    assert_eq!(
        dependencies("use super::watcher::W;", &path("runner")),
        BTreeSet::from(["watcher".to_string()])
    );
    // Comments and test modules are not dependencies; a module's re-exports are.
    let code = "// crate::web\npub use crate::store::{A,\n B};\nfn g() {}\n\
                #[cfg(test)]\nmod tests {\n    use crate::cli::x;\n    fn h() { let s = \"{}\"; }\n}\n\
                fn after() { crate::events::e(); }\n";
    assert_eq!(
        dependencies(&library_code(code), &path("judgement")),
        BTreeSet::from(["events".to_string(), "store".to_string()])
    );
    // A façade depends on what it re-exports: one in the pure layer that gathers the store's
    // types points up; above the store it does not.
    let facade = "//! Docs.\n\npub use crate::store::{A,\n B};\n#[doc(inline)]\n\
                  pub use crate::schema::{C, D};\n";
    let layer = |name: &str, modules: &[&str]| {
        (
            name.to_string(),
            modules
                .iter()
                .map(|m| m.to_string())
                .collect::<BTreeSet<_>>(),
        )
    };
    let graph = BTreeMap::from([
        (
            "marker".to_string(),
            dependencies(&library_code(facade), &path("marker")),
        ),
        ("store".to_string(), BTreeSet::from(["schema".to_string()])),
        ("schema".to_string(), BTreeSet::new()),
    ]);
    let in_the_pure_layer = [
        layer("io", &["store"]),
        layer("pure", &["marker", "schema"]),
    ];
    assert_eq!(
        upward(&in_the_pure_layer, &graph),
        ["marker (layer \"pure\") uses store (layer \"io\")"]
    );
    let above_the_store = [
        layer("wiring", &["marker"]),
        layer("io", &["store"]),
        layer("pure", &["schema"]),
    ];
    assert!(upward(&above_the_store, &graph).is_empty());
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(m, d)| (m.to_string(), d.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        find_circle(&graph),
        Some(["a", "b", "c", "a"].map(String::from).to_vec())
    );
    let mut acyclic = graph.clone();
    acyclic.insert("c".into(), BTreeSet::new());
    assert_eq!(find_circle(&acyclic), None);
}

/// The command line's words in a line of library code: a flag (`--name`) or a verb of the
/// `planned-stop` binary.
fn command_line_words(line: &str) -> Option<&str> {
    let verbs = [
        "stop", "serve", "status", "inspect", "records", "clear", "sweep", "demo",
    ];
    if let Some(at) = line.find("--") {
        let rest = &line[at + 2..];
        if rest.starts_with(|c: char| c.is_ascii_lowercase()) {
            let flag = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(rest.len());
            return Some(&line[at..at + 2 + flag]);
        }
    }
    let at = line.find("planned-stop ")?;
    let word = ident(&line[at + "planned-stop ".len()..]);
    verbs.contains(&word).then_some(word)
}

/// The string literals of `code` (their text between the quotes, escapes as written), with the
/// line each starts on; raw strings included, char literals and lifetimes skipped.
fn string_literals(code: &str) -> Vec<(usize, String)> {
    let chars: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\n' => line += 1,
            '\'' if chars.get(i + 1) == Some(&'\\') => {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
            }
            '\'' if chars.get(i + 2) == Some(&'\'') => i += 2,
            'r' if matches!(chars.get(i + 1), Some('"' | '#'))
                && (i == 0 || !is_ident_char(chars[i - 1])) =>
            {
                let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
                if chars.get(i + 1 + hashes) == Some(&'"') {
                    let start = i + 2 + hashes;
                    let mut end = start;
                    while end < chars.len()
                        && !(chars[end] == '"'
                            && chars[end + 1..].iter().take_while(|&&c| c == '#').count() >= hashes)
                    {
                        end += 1;
                    }
                    let text: String = chars[start..end.min(chars.len())].iter().collect();
                    found.push((line, text.clone()));
                    line += text.matches('\n').count();
                    i = end + hashes;
                }
            }
            '"' => {
                let start = i + 1;
                let mut end = start;
                while end < chars.len() && chars[end] != '"' {
                    end += if chars[end] == '\\' { 2 } else { 1 };
                }
                let text: String = chars[start..end.min(chars.len())].iter().collect();
                found.push((line, text.clone()));
                line += text.matches('\n').count();
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The first path into an API in `text`: a type and one of its items (`Type::method`).
fn api_path(text: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(at) = text[from..].find("::").map(|at| from + at) {
        let before = text[..at]
            .rfind(|c: char| !is_ident_char(c))
            .map_or(0, |b| b + 1);
        let after = at + 2 + ident(&text[at + 2..]).len();
        let owner = &text[before..at];
        if owner.starts_with(|c: char| c.is_ascii_uppercase()) && after > at + 2 {
            return Some(&text[before..after]);
        }
        from = at + 2;
    }
    None
}

/// What a message for people names that it should not: a flag or verb of the command line
/// (which an application embedding the crate may not ship; the command line adds its own words
/// where it reports an error), or a path into the API (`ServiceBuilder::lease_for`: an operator
/// reading a log has no use for it). A message says what to do in words.
fn unspeakable(literal: &str) -> Option<&str> {
    if !literal.contains(' ') {
        // A path an attribute names (`skip_serializing_if = "Option::is_none"`), no message.
        return None;
    }
    command_line_words(literal).or_else(|| api_path(literal))
}

/// A literal as the compiler reads it, as far as spacing goes: a `\` at the end of a line drops
/// the line break and the next line's indentation.
fn continued(literal: &str) -> String {
    let mut out = String::new();
    let mut rest = literal;
    while let Some(at) = rest.find("\\\n") {
        out.push_str(&rest[..at]);
        rest = rest[at + 2..].trim_start();
    }
    out.push_str(rest);
    out
}

/// A run of three or more spaces after a word of a message, or a line break inside it followed
/// by indentation (a line continued without its `\\`): a person reads either as a hole in the
/// sentence.
fn run_of_spaces(literal: &str) -> bool {
    let text = continued(literal);
    let after_word = text
        .match_indices("   ")
        .any(|(at, _)| at > 0 && !text[..at].ends_with([' ', '\n']));
    let indented_break = text.contains("\n ");
    after_word || indented_break
}

/// Every string literal of the non-test sources under `dirs`: where it is (`path:line`) and
/// what it says.
fn message_literals(dirs: &[&str]) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for src in dirs.iter().map(|dir| root().join(dir)) {
        for path in rust_files(&src) {
            if is_test_file(path.strip_prefix(&src).unwrap()) {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (line, literal) in string_literals(&library_code(&text)) {
                found.push((format!("{}:{line}", path.display()), literal));
            }
        }
    }
    found
}

/// Neither the library's messages nor the command line's have a run of spaces in a sentence.
#[test]
fn no_message_has_a_run_of_spaces() {
    let found: Vec<_> = message_literals(&["src", "protocol/src", "postgres/src", "cli/src"])
        .into_iter()
        .filter(|(_, literal)| {
            let sql = ["CREATE TABLE", "ALTER TABLE"]
                .iter()
                .any(|q| literal.contains(q));
            run_of_spaces(literal) && !sql
        })
        .map(|(at, literal)| format!("{at}: {literal:?}"))
        .collect();
    assert!(found.is_empty(), "{found:#?}");
}

/// The library's errors and logs say what to do in words: neither the command line's flags and
/// verbs nor the API's paths. Doc comments may name both; messages may not.
#[test]
fn the_librarys_messages_name_neither_flags_nor_api_paths() {
    let found: Vec<_> = message_literals(&PUBLISHED_LIBRARIES)
        .into_iter()
        .filter_map(|(at, literal)| {
            unspeakable(&literal).map(|word| format!("{at}: {word:?} in {literal:?}"))
        })
        .collect();
    assert!(found.is_empty(), "{found:#?}");
}

/// The literal scan finds each literal once, whatever quotes, escapes, raw strings and char
/// literals come between, and a message's path or flag in it.
#[test]
fn the_message_scan_sees_literals_paths_and_flags() {
    let code =
        "let c = '\"'; let l: &'a str = \"one \\\" two\";\nf(r#\"raw \"q\" x\"#, '\\'', \"ok\");";
    let literals: Vec<String> = string_literals(code).into_iter().map(|(_, l)| l).collect();
    assert_eq!(literals, ["one \\\" two", "raw \"q\" x", "ok"]);
    assert_eq!(string_literals("a\n\"b\nc\"\n\"d\"")[1].0, 4);
    assert_eq!(
        unspeakable("give ServiceBuilder::lease_for at least 1 s"),
        Some("ServiceBuilder::lease_for")
    );
    assert_eq!(unspeakable("see crate::record::list"), None);
    assert_eq!(
        unspeakable("opt in with --allow-shared-dir"),
        Some("--allow-shared-dir")
    );
    assert_eq!(unspeakable("no resume item {id}"), None);
    assert_eq!(unspeakable("Option::is_none"), None);
    assert!(run_of_spaces("it had          accepted"));
    assert!(run_of_spaces("it had\n         accepted"));
    assert!(!run_of_spaces("it had \\\n         accepted"));
    assert!(!run_of_spaces("   indented {what}"));
}

/// The scan sees a flag and a verb, and nothing else.
#[test]
fn the_command_line_scan_sees_flags_and_verbs() {
    assert_eq!(
        command_line_words(r#"  "insist with --signal-anyway""#),
        Some("--signal-anyway")
    );
    assert_eq!(
        command_line_words(r#""see `planned-stop records list`""#),
        Some("records")
    );
    assert_eq!(command_line_words(r#""ServiceBuilder::lease_for""#), None);
    assert_eq!(command_line_words(r#""the planned-stop runner""#), None);
    assert_eq!(command_line_words("let x = a - -b;"), None);
}

/// The ```` ```rust ```` blocks of `markdown` (any info string starting with `rust`), each as its
/// lines.
fn rust_blocks(markdown: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in markdown.lines() {
        match current.as_mut() {
            None if line.starts_with("```rust") => current = Some(Vec::new()),
            None => {}
            Some(_) if line == "```" => blocks.extend(current.take()),
            Some(block) => block.push(line.to_string()),
        }
    }
    blocks
}

/// What rustdoc shows of a doctest's lines: those hidden with `# ` (or a lone `#`) left out.
fn visible(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .filter(|l| !(l.as_str() == "#" || l.starts_with("# ")))
        .cloned()
        .collect()
}

/// The README's Rust blocks compile: `tests/readme-blocks.md` holds them as doctests (built with
/// the `actix-web` feature), and what rustdoc shows of each is the README's block, line for line.
#[test]
fn the_readmes_rust_blocks_are_the_compiled_doctests() {
    let readme = rust_blocks(&std::fs::read_to_string(root().join("README.md")).unwrap());
    let doctests =
        rust_blocks(&std::fs::read_to_string(root().join("tests/readme-blocks.md")).unwrap());
    assert_eq!(
        readme.len(),
        doctests.len(),
        "every README block has its doctest in tests/readme-blocks.md"
    );
    for (n, (shown, compiled)) in readme.iter().zip(&doctests).enumerate() {
        assert_eq!(
            shown,
            &visible(compiled),
            "README block {n} differs from its doctest's visible lines: edit both"
        );
    }
    // The check sees a difference: a README line the doctest does not have.
    let mut edited = readme[0].clone();
    edited.push("// a line added to the README only".into());
    assert_ne!(edited, visible(&doctests[0]));
}

/// The files of `names` (the `.rs` files directly in `tests/`) that `tests_rs` does not declare
/// as a module: with `autotests = false`, such a file is compiled by nothing and its tests never
/// run. `tests.rs` itself and `systemd.rs` (a binary of its own, `Cargo.toml`) are not modules.
fn undeclared_test_files(names: &[String], tests_rs: &str) -> Vec<String> {
    let declared: BTreeSet<&str> = tests_rs
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .collect();
    names
        .iter()
        .filter_map(|n| n.strip_suffix(".rs"))
        .filter(|n| !["tests", "systemd"].contains(n) && !declared.contains(n))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_test_file_is_a_module_of_the_one_test_binary() {
    let dir = root().join("tests");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".rs"))
        .collect();
    let tests_rs = std::fs::read_to_string(dir.join("tests.rs")).unwrap();
    assert_eq!(
        undeclared_test_files(&names, &tests_rs),
        Vec::<String>::new(),
        "declare each in tests/tests.rs (`mod NAME;`, with a line saying what it tests)"
    );
    // The check sees a file left out, and a module behind a `cfg` counts as declared.
    let names = ["a.rs", "b.rs", "tests.rs", "systemd.rs"].map(String::from);
    assert_eq!(
        undeclared_test_files(&names, "#[cfg(unix)]\nmod a;\n"),
        ["b"]
    );
}

/// The places in `code` where a test would run cargo itself (the `CARGO` variable, a `Command` of
/// `cargo`): a build inside a test, with features and a target of its own, instead of the
/// program the same `cargo test` built (`CARGO_BIN_EXE_*`).
fn cargo_runs(code: &str) -> Vec<usize> {
    // Spelled in pieces, so this file does not find itself.
    let patterns = [
        concat!("env!(\"CARGO", "\")"),
        concat!("Command::new(\"car", "go\")"),
    ];
    code.lines()
        .enumerate()
        .filter(|(_, line)| patterns.iter().any(|p| line.contains(p)))
        .map(|(n, _)| n + 1)
        .collect()
}

#[test]
fn no_test_runs_cargo_and_no_published_package_holds_the_tests() {
    let found: Vec<String> = rust_files(&root().join("tests"))
        .into_iter()
        .flat_map(|path| {
            let code = std::fs::read_to_string(&path).unwrap();
            cargo_runs(&code)
                .into_iter()
                .map(move |n| format!("{}:{n}", path.display()))
        })
        .collect();
    assert_eq!(
        found,
        Vec::<String>::new(),
        "a program a test starts is a binary of tests/Cargo.toml, found with common::helper_program"
    );
    // The published manifests name no file of tests/ (their targets, their `include`).
    for manifest in ["Cargo.toml", "cli/Cargo.toml", "protocol/Cargo.toml"] {
        let text = std::fs::read_to_string(root().join(manifest)).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter(|l| l.contains("\"tests/") || l.contains("\"/tests"))
            .collect();
        assert_eq!(lines, Vec::<&str>::new(), "{manifest} publishes tests");
    }
    // The check sees both ways of running cargo.
    let code = format!(
        "let a = 1;\nCommand::new({}CARGO{});\nCommand::new(\"{}\");\n",
        "env!(\"", "\")", "cargo"
    );
    assert_eq!(cargo_runs(&code), [2, 3]);
}
