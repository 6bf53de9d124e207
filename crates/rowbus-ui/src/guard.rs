//! What lets a request run an operation: a POST, and either the dashboard's token in its
//! header or, without a token, a request the browser does not mark as coming from another
//! site (the host service's authentication having admitted it).

use axum::extract::{Request, State};
use axum::http::header::{HOST, ORIGIN};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::token::{TOKEN_HEADER, Token};

/// Why a request without a token may not run an operation, if it may not: another site's
/// page sent it. A browser names the page's origin in `Origin` on every POST and, since
/// 2020 in every major browser, says `Sec-Fetch-Site`; a program sends neither and is
/// judged by the host's authentication alone.
fn cross_site(headers: &HeaderMap) -> Option<(StatusCode, &'static str)> {
    const REFUSED: (StatusCode, &str) =
        (StatusCode::FORBIDDEN, "operations are taken from the dashboard's own page only\n");
    if headers.get("sec-fetch-site").is_some_and(|v| v.as_bytes() == b"cross-site") {
        return Some(REFUSED);
    }
    // No Origin: not a browser's cross-site request (it names one on every POST).
    let origin = headers.get(ORIGIN)?;
    // `Origin: scheme://host[:port]`, or `null` from a sandboxed or opaque page.
    let origin_host = origin.to_str().ok().and_then(|o| o.split_once("://")).map(|(_, host)| host);
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    match (origin_host, host) {
        (Some(origin), Some(host)) if origin.eq_ignore_ascii_case(host) => None,
        _ => Some(REFUSED),
    }
}

/// Why `method` with `headers` may not run an operation under `token`, if it may not.
fn refuse(token: Option<&Token>, method: &Method, headers: &HeaderMap) -> Option<(StatusCode, &'static str)> {
    match token {
        Some(token) => token.refuse(method, headers.get(TOKEN_HEADER).map(|v| v.as_bytes())),
        None if method != Method::POST => Some((StatusCode::METHOD_NOT_ALLOWED, "operations take POST\n")),
        None => cross_site(headers),
    }
}

/// Middleware over the operations.
pub(crate) async fn require(State(token): State<Option<Token>>, request: Request, next: Next) -> Response {
    match refuse(token.as_ref(), request.method(), request.headers()) {
        Some(refusal) => refusal.into_response(),
        None => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (k.parse().unwrap(), HeaderValue::from_static(v))).collect()
    }

    /// Without a token: a program's POST passes, and so does the page's own (same origin);
    /// another site's is refused, by its Origin or by Sec-Fetch-Site; only POST runs.
    #[test]
    fn without_a_token_only_same_site_posts_pass() {
        let post = |pairs| refuse(None, &Method::POST, &headers(pairs)).map(|r| r.0);
        assert_eq!(post(&[]), None);
        assert_eq!(post(&[("host", "app.example:8080"), ("origin", "https://app.example:8080")]), None);
        assert_eq!(post(&[("host", "app.example"), ("sec-fetch-site", "same-origin")]), None);
        for cross in [
            &[("host", "app.example:8080"), ("origin", "https://evil.example")][..],
            &[("host", "app.example:8080"), ("origin", "https://app.example:9090")],
            &[("host", "app.example"), ("origin", "null")],
            &[("origin", "https://app.example")],
            &[("host", "app.example"), ("sec-fetch-site", "cross-site")],
        ] {
            assert_eq!(post(cross), Some(StatusCode::FORBIDDEN), "{cross:?}");
        }
        assert_eq!(
            refuse(None, &Method::GET, &headers(&[])).map(|r| r.0),
            Some(StatusCode::METHOD_NOT_ALLOWED)
        );
    }

    /// With a token, the token decides: the same origin without it is refused.
    #[test]
    fn with_a_token_the_token_decides() {
        let token = Token::given("0123456789abcdef").unwrap();
        let same = headers(&[("host", "a"), ("origin", "http://a")]);
        assert_eq!(refuse(Some(&token), &Method::POST, &same).map(|r| r.0), Some(StatusCode::FORBIDDEN));
        let with = headers(&[("x-rowbus-token", "0123456789abcdef")]);
        assert_eq!(refuse(Some(&token), &Method::POST, &with), None);
    }
}
