//! The code the docs show is code `cargo test` compiles: the README's quick start is
//! `examples/quick_start.rs` byte for byte, and docs/composition.md shows
//! `examples/tower_http.rs`.

/// The first rust block after `heading` in `page`.
fn block_after<'a>(page: &'a str, heading: &str) -> &'a str {
    let section = &page[page.find(heading).expect("the heading")..];
    let start = section.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let block = &section[start..];
    &block[..block.find("```").expect("the block ends")]
}

#[test]
fn the_readme_quick_start_is_the_compiled_example() {
    assert_eq!(
        block_after(include_str!("../README.md"), "## Quick start"),
        include_str!("../examples/quick_start.rs")
    );
}

#[test]
fn the_composition_guide_shows_the_compiled_example() {
    assert_eq!(
        block_after(
            include_str!("../docs/composition.md"),
            "# Composing with tower-http"
        ),
        include_str!("../examples/tower_http.rs")
    );
}
