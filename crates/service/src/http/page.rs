//! A page of a list (`GET /v1/payments`, `GET /v1/refunds`, `GET /v1/events`): how many items, and whether more follow.

use super::error::ApiError;

const DEFAULT_PAGE: i64 = 10;
const MAX_PAGE: i64 = 100;

/// The page size a list was asked for (`limit`), within its bounds.
pub(super) fn limit(asked: Option<i64>) -> Result<i64, ApiError> {
    let limit = asked.unwrap_or(DEFAULT_PAGE);
    match (1..=MAX_PAGE).contains(&limit) {
        true => Ok(limit),
        false => Err(ApiError::InvalidRequest(format!("limit must be from 1 to {MAX_PAGE}."))),
    }
}

/// Cuts `fetched`, read with one item more than `limit`, to the page: whether more follow.
pub(super) fn cut<T>(fetched: &mut Vec<T>, limit: i64) -> bool {
    let has_more = fetched.len() as i64 > limit;
    fetched.truncate(limit as usize);
    has_more
}
