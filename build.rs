//! Rebuilds the library when a migration changes: `embed_migrations!` reads the trees at
//! compile time, and cargo does not know it.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
