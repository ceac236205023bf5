//! The README's quick start is `examples/quick_start.rs` byte for byte, so the code a newcomer
//! copies is the code `cargo test` compiles.

#[test]
fn the_readme_quick_start_is_the_compiled_example() {
    let readme = include_str!("../README.md");
    let section = &readme[readme
        .find("## Quick start")
        .expect("a Quick start section")..];
    let start = section.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let block = &section[start..];
    let block = &block[..block.find("```").expect("the block ends")];
    assert_eq!(block, include_str!("../examples/quick_start.rs"));
}
