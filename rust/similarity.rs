//! String similarity for near-miss FENs.

/// Longest text compared; anything longer is a wrong answer anyway and must not cost O(n^2).
const MAX_LEN: usize = 256;

/// Levenshtein distance over bytes.
pub fn edit_distance(a: &[u8], b: &[u8]) -> usize {
    // A common prefix or suffix never changes the distance, and near-miss FENs share long ones.
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[prefix..], &b[prefix..]);
    let suffix = a.iter().rev().zip(b.iter().rev()).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[..a.len() - suffix], &b[..b.len() - suffix]);
    if a.is_empty() || b.is_empty() {
        return a.len().max(b.len());
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != cb);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// 1 - normalised edit distance, in [0, 1]; 1 only for equal strings.
pub fn similarity(a: &str, b: &str) -> f64 {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (a, b) = (&a[..a.len().min(MAX_LEN)], &b[..b.len().min(MAX_LEN)]);
    let longest = a.len().max(b.len());
    if longest == 0 {
        return 1.0;
    }
    1.0 - edit_distance(a, b) as f64 / longest as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance(b"kitten", b"sitting"), 3);
        assert_eq!(edit_distance(b"", b"abc"), 3);
        assert_eq!(edit_distance(b"abc", b"abc"), 0);
        assert_eq!(edit_distance(b"abcXdef", b"abcdef"), 1);
        assert_eq!(edit_distance(b"aaaa", b"aa"), 2);
        assert_eq!(edit_distance(b"flaw", b"lawn"), 2);
        assert_eq!(edit_distance(b"8/8/8/R7 w - - 0 1", b"8/8/8/7R b - - 0 1"), 3);
        assert_eq!(similarity("abcd", "abcd"), 1.0);
        assert_eq!(similarity("abcd", "abce"), 0.75);
        assert_eq!(similarity("", "abcd"), 0.0);
    }
}
