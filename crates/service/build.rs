// `embed_migrations!` reads `migrations/` at compile time, but cargo does not know that a new
// migration folder should trigger a rebuild unless told.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
