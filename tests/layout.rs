//! The shape of `src/`, held by the test suite: no two sibling modules depend on each other,
//! directly or through their other siblings; no file over 700 lines; no function over 80.
//!
//! A module depends on the modules that define what its `use` declarations and its `crate::`,
//! `super::` and `self::` paths name, each path followed through the `use` declarations
//! (re-exports included) of the modules it passes. A module and its own submodules may use each
//! other: that is a room and its parts. Two siblings that need each other are one room split in
//! two, or a third thing both should depend on.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

const MAX_FILE_LINES: usize = 700;
const MAX_FN_LINES: usize = 80;

type ModPath = Vec<String>;

/// What a path resolves to: a module, or an item defined in a module.
#[derive(Clone, Debug, PartialEq)]
enum Target {
    Module(ModPath),
    Item(ModPath),
}

impl Target {
    fn module(&self) -> &ModPath {
        match self {
            Target::Module(m) | Target::Item(m) => m,
        }
    }
}

/// One imported name: `path` names it where it comes from; `name` is None for a glob.
struct Import {
    path: Vec<String>,
    name: Option<String>,
}

/// A path the module names, and where.
struct Named {
    path: Vec<String>,
    line: usize,
}

#[derive(Default)]
struct Module {
    file: PathBuf,
    items: BTreeSet<String>,
    children: BTreeSet<String>,
    imports: Vec<Import>,
    named: Vec<Named>,
}

#[derive(Default)]
struct Crate {
    modules: BTreeMap<ModPath, Module>,
}

impl Crate {
    fn load(root: &Path) -> Self {
        let mut krate = Crate::default();
        krate.load_file(vec![], &root.join("lib.rs"), &root.join(""));
        krate
    }

    /// `file` is the module `path`; its `mod x;` children live in `dir`.
    fn load_file(&mut self, path: ModPath, file: &Path, dir: &Path) {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        self.load_items(path, file, dir, &parsed.items);
    }

    fn load_items(&mut self, path: ModPath, file: &Path, dir: &Path, items: &[syn::Item]) {
        let mut module = Module {
            file: file.to_owned(),
            ..Module::default()
        };
        for item in items {
            match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    module.children.insert(name.clone());
                    let mut child = path.clone();
                    child.push(name.clone());
                    match &m.content {
                        Some((_, inner)) => self.load_items(child, file, dir, inner),
                        None => {
                            let flat = dir.join(format!("{name}.rs"));
                            let (file, sub) = if flat.exists() {
                                (flat, dir.join(&name))
                            } else {
                                (dir.join(&name).join("mod.rs"), dir.join(&name))
                            };
                            self.load_file(child, &file, &sub);
                        }
                    }
                }
                syn::Item::Use(u) => imports(&u.tree, &mut vec![], &mut module.imports),
                other => {
                    if let Some(name) = item_name(other) {
                        module.items.insert(name);
                    }
                    let mut paths = Paths(&mut module.named);
                    paths.visit_item(other);
                }
            }
        }
        self.modules.insert(path, module);
    }

    /// What `path`, named in module `from`, refers to inside this crate (None for other crates).
    fn resolve(&self, from: &ModPath, path: &[String], depth: usize) -> Option<Target> {
        if depth > 16 {
            return None;
        }
        let (mut at, rest) = match path.first()?.as_str() {
            "crate" => (vec![], &path[1..]),
            "self" => (from.clone(), &path[1..]),
            "super" => {
                let supers = path.iter().take_while(|s| *s == "super").count();
                (
                    from[..from.len().checked_sub(supers)?].to_vec(),
                    &path[supers..],
                )
            }
            _ => (from.clone(), path),
        };
        for segment in rest {
            match self.lookup(&at, segment, depth)? {
                Target::Module(m) => at = m,
                item => return Some(item),
            }
        }
        Some(Target::Module(at))
    }

    /// `name` as module `at` sees it: a child module, an item of its own, or an import.
    fn lookup(&self, at: &ModPath, name: &str, depth: usize) -> Option<Target> {
        let module = self.modules.get(at)?;
        if module.children.contains(name) {
            let mut child = at.clone();
            child.push(name.to_owned());
            return Some(Target::Module(child));
        }
        if module.items.contains(name) {
            return Some(Target::Item(at.clone()));
        }
        let named = module
            .imports
            .iter()
            .filter(|i| i.name.as_deref() == Some(name));
        let globs = module.imports.iter().filter(|i| i.name.is_none());
        named
            .filter_map(|i| self.resolve(at, &i.path, depth + 1))
            .chain(
                globs.filter_map(|g| match self.resolve(at, &g.path, depth + 1)? {
                    Target::Module(m) => self.lookup(&m, name, depth + 1),
                    Target::Item(_) => None,
                }),
            )
            .next()
    }

    /// Each dependency between two modules, with the line that makes it.
    fn dependencies(&self) -> Vec<(ModPath, ModPath, String)> {
        let mut found = vec![];
        for (from, module) in &self.modules {
            let named = module.named.iter().map(|n| (&n.path, Some(n.line)));
            let imported = module.imports.iter().map(|i| (&i.path, None));
            for (path, line) in imported.chain(named) {
                let Some(target) = self.resolve(from, path, 0) else {
                    continue;
                };
                let place = match line {
                    Some(line) => format!("{}:{line}", module.file.display()),
                    None => format!("{} (use)", module.file.display()),
                };
                let what = format!("{place} names {}", path.join("::"));
                found.push((from.clone(), target.module().clone(), what));
            }
        }
        found
    }
}

/// The name an item defines in its module's namespace.
fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

fn imports(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<Import>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            imports(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) if n.ident == "self" => out.push(Import {
            path: prefix.clone(),
            name: prefix.last().cloned(),
        }),
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            path.push(n.ident.to_string());
            out.push(Import {
                path,
                name: Some(n.ident.to_string()),
            });
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            path.push(r.ident.to_string());
            out.push(Import {
                path,
                name: Some(r.rename.to_string()),
            });
        }
        syn::UseTree::Glob(_) => out.push(Import {
            path: prefix.clone(),
            name: None,
        }),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                imports(tree, prefix, out);
            }
        }
    }
}

/// The `crate::`, `super::` and `self::` paths inside an item.
struct Paths<'a>(&'a mut Vec<Named>);

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if matches!(
            segments.first().map(String::as_str),
            Some("crate" | "super" | "self")
        ) && segments.len() > 1
        {
            let line = path.segments[0].ident.span().start().line;
            self.0.push(Named {
                path: segments,
                line,
            });
        }
        syn::visit::visit_path(self, path);
    }
}

/// Groups of sibling modules that depend on each other, each with the lines that tie it.
fn circles(krate: &Crate) -> Vec<String> {
    // parent -> (child -> child it depends on -> the first line that makes it)
    let mut siblings: BTreeMap<ModPath, BTreeMap<String, BTreeMap<String, String>>> =
        BTreeMap::new();
    for (from, to, what) in krate.dependencies() {
        let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
        if common == from.len() || common == to.len() {
            continue;
        }
        siblings
            .entry(from[..common].to_vec())
            .or_default()
            .entry(from[common].clone())
            .or_default()
            .entry(to[common].clone())
            .or_insert(what);
    }
    let mut found = vec![];
    for (parent, graph) in &siblings {
        for group in strongly_connected(graph) {
            let ties: Vec<String> = group
                .iter()
                .flat_map(|a| {
                    graph[a]
                        .iter()
                        .filter(|(b, _)| group.contains(*b))
                        .map(move |(b, what)| format!("  {a} -> {b}: {what}"))
                })
                .collect();
            let at = std::iter::once("crate".to_owned())
                .chain(parent.iter().cloned())
                .collect::<Vec<_>>()
                .join("::");
            found.push(format!("in {at}:\n{}", ties.join("\n")));
        }
    }
    found
}

/// The groups of two or more nodes that reach each other (Tarjan's algorithm).
fn strongly_connected(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeMap<String, String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        groups: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, node: &'g str) {
        let i = s.index.len();
        s.index.insert(node, i);
        s.low.insert(node, i);
        s.stack.push(node);
        for next in s.graph.get(node).into_iter().flat_map(|n| n.keys()) {
            if !s.index.contains_key(next.as_str()) {
                visit(s, next);
                s.low.insert(node, s.low[node].min(s.low[next.as_str()]));
            } else if s.stack.contains(&next.as_str()) {
                s.low.insert(node, s.low[node].min(s.index[next.as_str()]));
            }
        }
        if s.low[node] == s.index[node] {
            let at = s
                .stack
                .iter()
                .rposition(|n| *n == node)
                .expect("on the stack");
            let group: Vec<String> = s.stack.drain(at..).map(str::to_owned).collect();
            if group.len() > 1 {
                s.groups.push(group);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: vec![],
        groups: vec![],
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.groups
}

fn src() -> PathBuf {
    Path::new("src").to_owned()
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_two_sibling_modules_depend_on_each_other() {
    let krate = Crate::load(&src());
    assert!(
        krate
            .modules
            .contains_key(&vec!["store".to_owned(), "any".to_owned()]),
        "the module tree was not read"
    );
    let found = circles(&krate);
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

/// The check sees a circle that goes through a re-export: `store::error` naming
/// `crate::store::Engine`, which `store/mod.rs` re-exports from `store::any`, while `store::any`
/// uses `store::error`.
#[test]
fn a_circle_through_a_re_export_is_seen() {
    let mut krate = Crate::load(&src());
    let error = vec!["store".to_owned(), "error".to_owned()];
    krate.modules.get_mut(&error).unwrap().named.push(Named {
        path: vec!["crate".into(), "store".into(), "AnyStore".into()],
        line: 1,
    });
    let found = circles(&krate);
    assert!(
        found.iter().any(|c| c.contains("error -> any")),
        "{found:?}"
    );
}

#[test]
fn no_file_is_over_700_lines_and_no_function_over_80() {
    let mut files = vec![];
    sources(&src(), &mut files);
    files.sort();
    let mut long = vec![];
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES {
            long.push(format!("{}: {lines} lines", file.display()));
        }
        let parsed = syn::parse_file(&text).unwrap();
        let mut fns = Functions(vec![]);
        fns.visit_file(&parsed);
        for (name, start, end) in fns.0 {
            if end - start + 1 > MAX_FN_LINES {
                let lines = end - start + 1;
                long.push(format!(
                    "{}:{start}: fn {name}, {lines} lines",
                    file.display()
                ));
            }
        }
    }
    assert!(long.is_empty(), "too long:\n{}", long.join("\n"));
}

/// Each function's name and the lines of its signature's start and its body's end.
struct Functions(Vec<(String, usize, usize)>);

impl Functions {
    fn add(&mut self, sig: &syn::Signature, block: &syn::Block) {
        let start = sig.fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        self.0.push((sig.ident.to_string(), start, end));
    }
}

impl<'ast> Visit<'ast> for Functions {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.add(&f.sig, &f.block);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.add(&f.sig, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.add(&f.sig, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}
