//! `embed_migrations!` reads `migrations/` at compile time, but cargo does not know that a new
//! migration folder should trigger a rebuild unless told. The same folders' `up.sql` texts are
//! embedded once more, as a list (`$OUT_DIR/migration_texts.rs`: name, text, and whether it runs in
//! a transaction, `metadata.toml`'s `run_in_transaction`), for the runner that applies them to a
//! distributed database (see `src/db/migrate.rs`).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("../../migrations");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with('.') && root.join(name).join("up.sql").is_file())
        .collect();
    names.sort();
    let entries: String = names
        .iter()
        .map(|name| {
            let up = root.join(name).join("up.sql").canonicalize().unwrap();
            let metadata = std::fs::read_to_string(root.join(name).join("metadata.toml")).unwrap_or_default();
            let in_transaction = !metadata.lines().any(|line| line.replace(' ', "") == "run_in_transaction=false");
            format!("    ({name:?}, include_str!({up:?}), {in_transaction}),\n")
        })
        .collect();
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("migration_texts.rs");
    std::fs::write(out, format!("&[\n{entries}]\n")).unwrap();
}
