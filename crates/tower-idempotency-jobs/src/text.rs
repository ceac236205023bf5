//! A job's last error as it is stored: bounded in length.

/// The longest last error kept per job, in bytes.
pub const MAX_ERROR_LEN: usize = 1024;

/// `text` cut to at most [`MAX_ERROR_LEN`] bytes, at a char boundary.
pub fn bounded(mut text: String) -> String {
    if text.len() > MAX_ERROR_LEN {
        let mut end = MAX_ERROR_LEN;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_errors_are_cut_at_a_char_boundary() {
        let cut = bounded("é".repeat(MAX_ERROR_LEN));
        assert!(cut.len() <= MAX_ERROR_LEN && cut.len() > MAX_ERROR_LEN - 2);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(bounded("short".into()), "short");
    }
}
