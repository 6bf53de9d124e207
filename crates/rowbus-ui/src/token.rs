//! The dashboard's token: what a request that changes state must carry, so that a page
//! on another site, which can make the operator's browser send requests to the loopback
//! address, cannot trigger an operation.
//!
//! The token travels in a header of its own: a page elsewhere cannot set one on a
//! cross-site request without a CORS preflight this server never grants, and cannot read
//! the token, which the page learns from its URL's fragment (never sent to a server), as
//! `rowbus ui` prints it.

use std::sync::Arc;

use axum::http::{Method, StatusCode};

use crate::UiError;

/// The header that carries the token.
pub const TOKEN_HEADER: &str = "x-rowbus-token";

/// Shortest token accepted from a caller.
pub(crate) const MIN_GIVEN: usize = 16;

/// The token a dashboard's operations must carry: letters, digits, `-`, `_` and `.`, so
/// that it fits a header and a URL fragment.
#[derive(Clone)]
pub struct Token(Arc<str>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// 128 random bits from the operating system, as 32 hex digits.
    pub fn generate() -> Result<Token, UiError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|e| UiError::Random(e.to_string()))?;
        Ok(Token(bytes.iter().map(|b| format!("{b:02x}")).collect::<String>().into()))
    }

    /// A token of the caller's: at least 16 characters, letters, digits, `-`, `_` and `.`
    /// only (it goes in a header and a URL).
    pub fn given(token: &str) -> Result<Token, UiError> {
        if token.len() < MIN_GIVEN
            || !token.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(UiError::BadToken);
        }
        Ok(Token(token.into()))
    }

    /// The token, to print or to put in the page's URL (`#token=...`).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `offered` is this token, comparing every byte whatever the first difference,
    /// so that the time taken does not tell how much of a guess was right.
    pub(crate) fn matches(&self, offered: &[u8]) -> bool {
        let ours = self.0.as_bytes();
        offered.len() == ours.len() && ours.iter().zip(offered).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
    }

    /// Why `request` may not run an operation, if it may not: it is not a POST, or it does
    /// not carry this token.
    pub(crate) fn refuse(
        &self,
        method: &Method,
        offered: Option<&[u8]>,
    ) -> Option<(StatusCode, &'static str)> {
        if method != Method::POST {
            return Some((StatusCode::METHOD_NOT_ALLOWED, "operations take POST\n"));
        }
        match offered {
            None => Some((
                StatusCode::FORBIDDEN,
                "missing the x-rowbus-token header: open the dashboard's URL with its #token\n",
            )),
            Some(offered) if !self.matches(offered) => Some((
                StatusCode::FORBIDDEN,
                "wrong x-rowbus-token: open the dashboard's URL with its #token\n",
            )),
            Some(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Made tokens are 32 hex digits and differ.
    #[test]
    fn generated_tokens_differ() {
        let (a, b) = (Token::generate().unwrap(), Token::generate().unwrap());
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a.as_str(), b.as_str());
    }

    /// Only the same bytes match: not a prefix, not a longer string, not another case.
    #[test]
    fn matches_only_itself() {
        let token = Token::given("abcdefghijklmnop").unwrap();
        assert!(token.matches(b"abcdefghijklmnop"));
        for other in
            [&b""[..], b"abcdefghijklmno", b"abcdefghijklmnopq", b"Abcdefghijklmnop", b"abcdefghijklmnoq"]
        {
            assert!(!token.matches(other), "{:?} matched", String::from_utf8_lossy(other));
        }
    }

    /// A POST with the token passes; a POST without it or with another is forbidden; any
    /// other method is refused even with the token.
    #[test]
    fn refuses_all_but_a_post_with_the_token() {
        let token = Token::given("0123456789abcdef").unwrap();
        let right = Some(&b"0123456789abcdef"[..]);
        assert_eq!(token.refuse(&Method::POST, right), None);
        assert_eq!(token.refuse(&Method::POST, None).map(|r| r.0), Some(StatusCode::FORBIDDEN));
        assert_eq!(
            token.refuse(&Method::POST, Some(b"0123456789abcdeF")).map(|r| r.0),
            Some(StatusCode::FORBIDDEN)
        );
        for method in [Method::GET, Method::PUT, Method::DELETE] {
            assert_eq!(token.refuse(&method, right).map(|r| r.0), Some(StatusCode::METHOD_NOT_ALLOWED));
        }
    }

    /// A token given on the command line must be long enough and fit a header and a URL.
    #[test]
    fn given_tokens_are_checked() {
        for bad in ["short", "has space in it!!!", "0123456789abcdef/", "ünïcödé-0123456789"] {
            assert!(Token::given(bad).is_err(), "{bad:?} accepted");
        }
        assert!(Token::given("abc.DEF_ghi-0123").is_ok());
    }
}
