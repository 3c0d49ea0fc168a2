//! Finished answers kept in memory, so that most replays need no database round trip at all.
//!
//! This is safe with any number of processes because an entry only ever holds what cannot change:
//! the answer of a *finished* key, which stays in the database exactly as stored until the key
//! expires, and no entry is served past that. A key's expiry is one fact, written by the database
//! when the key finished (`expires_at`), and each entry is served until then at most, on this
//! process's clock and early rather than late (a [`Deadline`]), whatever this process's own
//! retention: no process answers from memory what the database, or another process, already
//! answers `410`. An entry answers as the claim would: the stored answer for the same request, a
//! mismatch (422) for another, never anything for another account (the account is part of the
//! cache key). Unfinished keys are never cached, nor keys finished without a recorded expiry
//! (before it was recorded).

use std::sync::Arc;
use std::time::Duration;

use quick_cache::sync::{Cache, DefaultLifecycle};
use quick_cache::{DefaultHashBuilder, Equivalent, OptionsBuilder, Weighter};
use uuid::Uuid;

use super::clock::{Deadline, since_boot};
use super::key::MAX_KEY_LENGTH;
use super::store::{Endpoint, NewKey, StoredResponse};
use super::{Fingerprint, IdempotencyKey};

/// What an entry weighs besides its key and body, roughly: the fingerprint, the endpoint, the
/// expiry and the cache's own bookkeeping.
const ENTRY_OVERHEAD_BYTES: usize = 160;

/// What an entry weighs in all, about, for sizing the cache's table: a payment's answer and key.
const TYPICAL_ENTRY_BYTES: u64 = 512;

/// The largest answer the database stores (the `stored_body` domain's limit): a payment with many
/// long metadata values, escaped, comes close.
const MAX_STORED_BODY_BYTES: usize = 64 * 1024;

/// What the heaviest entry weighs: the longest key and the largest answer.
const HEAVIEST_ENTRY_BYTES: u64 = (MAX_KEY_LENGTH + MAX_STORED_BODY_BYTES + ENTRY_OVERHEAD_BYTES) as u64;

/// A finished key, as its claim would find it.
#[derive(Debug)]
struct Finished {
    fingerprint: Fingerprint,
    endpoint: &'static Endpoint,
    response: StoredResponse,
    /// When the key expires, at the latest.
    expires: Deadline,
}

/// An entry's key: the account, and the idempotency key within it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Entry {
    account_id: Uuid,
    key: Box<str>,
}

/// The same, borrowed from a request: a look-up allocates nothing. Its derived hash is
/// [`Entry`]'s (the same fields in the same order; `Box<str>` hashes as the `str` it holds).
#[derive(Hash)]
struct Lookup<'a> {
    account_id: Uuid,
    key: &'a str,
}

impl Equivalent<Entry> for Lookup<'_> {
    fn equivalent(&self, entry: &Entry) -> bool {
        self.account_id == entry.account_id && self.key == &*entry.key
    }
}

impl<'a> Lookup<'a> {
    fn of(asked: &Asked<'a>) -> Lookup<'a> {
        Lookup { account_id: asked.account_id, key: asked.key.as_str() }
    }
}

/// A request as the cache tells it from another: its account and key, and what it asks (its
/// endpoint and fingerprint). All a replay from memory needs: not the request's stored form.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub account_id: Uuid,
    pub key: &'a IdempotencyKey,
    pub endpoint: &'static Endpoint,
    pub fingerprint: Fingerprint,
}

impl<'a> From<&'a NewKey<'a>> for Asked<'a> {
    fn from(new: &'a NewKey<'a>) -> Asked<'a> {
        let NewKey { account_id, key, endpoint, fingerprint, .. } = *new;
        Asked { account_id, key, endpoint, fingerprint }
    }
}

/// An entry weighs its key, its body and [`ENTRY_OVERHEAD_BYTES`].
#[derive(Clone)]
struct Bytes;

impl Weighter<Entry, Arc<Finished>> for Bytes {
    fn weight(&self, entry: &Entry, finished: &Arc<Finished>) -> u64 {
        (entry.key.len() + finished.response.body.len() + ENTRY_OVERHEAD_BYTES) as u64
    }
}

/// What the cache knows of a key, as the claim would have found it.
#[derive(Debug)]
pub enum Remembered {
    /// The key's request finished with this answer: replay it.
    Replay(StoredResponse),
    /// The key was used with another request (422).
    Mismatch,
}

/// The finished answers of this process's recent requests and replays, bounded in bytes.
///
/// `quick_cache`, not `moka`: a look-up here is the whole of most replays, and moka's housekeeping
/// on every read costs twice as much (docs/performance.md, "A replay's tail"). Nothing here
/// expires by itself: each read checks the entry's expiry, on [`since_boot`] (a clock that counts
/// while the machine sleeps, as the database's does), so an expired entry is never served, and is
/// let go of when it is found.
pub struct ReplayCache {
    cache: Cache<Entry, Arc<Finished>, Bytes>,
}

impl ReplayCache {
    /// A cache of at most about `max_bytes` of keys and answers; the least useful go first.
    pub fn new(max_bytes: u64) -> ReplayCache {
        ReplayCache::for_cores(max_bytes, std::thread::available_parallelism().map_or(1, usize::from))
    }

    /// [`ReplayCache::new`] on a machine of `cores`. quick_cache splits the bytes into shards, four
    /// per core unless told otherwise, and refuses an entry heavier than about one shard: 4 MiB on
    /// 32 cores would hold no answer over 32 KiB, and every replay of a larger one would go to the
    /// database. So there are only as many shards as leave each room for two of the heaviest.
    fn for_cores(max_bytes: u64, cores: usize) -> ReplayCache {
        let roomy = usize::try_from(max_bytes / (2 * HEAVIEST_ENTRY_BYTES)).unwrap_or(usize::MAX);
        let shards = cores.saturating_mul(4).min(roomy).max(1);
        // quick_cache rounds a count of shards up to a power of two: round it down here instead.
        let shards = if shards.is_power_of_two() { shards } else { shards.next_power_of_two() / 2 };
        let options = OptionsBuilder::new()
            .shards(shards)
            .estimated_items_capacity(usize::try_from(max_bytes / TYPICAL_ENTRY_BYTES).unwrap_or(usize::MAX).max(1))
            .weight_capacity(max_bytes)
            .build()
            .expect("every option is set");
        let cache = Cache::with_options(options, Bytes, DefaultHashBuilder::default(), DefaultLifecycle::default());
        ReplayCache { cache }
    }

    /// What the claim of `asked` would find, if its key is a finished one held here: its answer
    /// for the same request, or a mismatch for another. `None`: ask the database.
    pub fn recall(&self, asked: &Asked<'_>) -> Option<Remembered> {
        self.recall_at(asked, since_boot())
    }

    /// [`ReplayCache::recall`] at `now`, a reading of [`since_boot`].
    fn recall_at(&self, asked: &Asked<'_>, now: Duration) -> Option<Remembered> {
        let finished = self.live(&Lookup::of(asked), now)?;
        let same_request = finished.fingerprint == asked.fingerprint && finished.endpoint == asked.endpoint;
        Some(match same_request {
            true => Remembered::Replay(finished.response.clone()),
            false => Remembered::Mismatch,
        })
    }

    /// Keeps the answer of `new`'s finished key until the key `expires`, and no longer.
    pub fn remember(&self, new: &NewKey<'_>, response: &StoredResponse, expires: Deadline) {
        if expires.has_passed() {
            return;
        }
        let finished =
            Finished { fingerprint: new.fingerprint, endpoint: new.endpoint, response: response.clone(), expires };
        let entry = Entry { account_id: new.account_id, key: new.key.as_str().into() };
        self.cache.insert(entry, Arc::new(finished));
    }

    /// Whether the key's answer is held here, and would be served (for tests and diagnostics).
    pub fn holds(&self, account_id: Uuid, key: &str) -> bool {
        self.live(&Lookup { account_id, key }, since_boot()).is_some()
    }

    /// The entry of a key that has not expired by `now`; an expired one is let go of.
    fn live(&self, lookup: &Lookup<'_>, now: Duration) -> Option<Arc<Finished>> {
        let finished = self.cache.get(lookup)?;
        if finished.expires.has_passed_at(now) {
            // Unless another request put a live answer there meanwhile.
            self.cache.remove_if(lookup, |finished| finished.expires.has_passed_at(now));
            return None;
        }
        Some(finished)
    }

    /// The bytes the entries weigh.
    pub fn weighed_bytes(&self) -> u64 {
        self.cache.weight()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static ENDPOINT: Endpoint = Endpoint {
        method: "POST",
        path: "/v1/payments",
        label: "payments",
        points: &[],
        made_in: "payments",
        at_gateway: true,
    };
    use crate::idempotency::IdempotencyKey;
    use crate::request_id::RequestId;

    #[test]
    fn the_cache_answers_like_the_claim_and_only_for_its_account() {
        let cache = ReplayCache::new(1 << 20);
        let key = IdempotencyKey::parse(b"order-1").unwrap();
        let (body, other_body) = (serde_json::json!({ "amount": 1 }), serde_json::json!({ "amount": 2 }));
        let (account, other_account) = (Uuid::now_v7(), Uuid::now_v7());
        let request_id = RequestId::generate();
        let new = |account_id, params| NewKey {
            account_id,
            key: &key,
            endpoint: &ENDPOINT,
            fingerprint: Fingerprint::of(params),
            params,
            request_id: &request_id,
            actor: crate::audit::Actor::Api,
        };
        let answer = StoredResponse { status: 201, body: b"{\"id\":1}".to_vec() };
        cache.remember(&new(account, &body), &answer, Deadline::after(Duration::from_secs(60)));

        let recall = |new: NewKey<'_>| cache.recall(&Asked::from(&new));
        match recall(new(account, &body)) {
            Some(Remembered::Replay(response)) => assert_eq!(response, answer),
            other => panic!("a replay, not {other:?}"),
        }
        assert!(matches!(recall(new(account, &other_body)), Some(Remembered::Mismatch)));
        assert!(recall(new(other_account, &body)).is_none(), "another account's key is its own");
    }

    #[test]
    fn a_key_that_expired_is_not_kept() {
        let cache = ReplayCache::new(1 << 20);
        let key = IdempotencyKey::parse(b"order-1").unwrap();
        let body = serde_json::json!({});
        let request_id = RequestId::generate();
        let new = NewKey {
            account_id: Uuid::nil(),
            key: &key,
            endpoint: &ENDPOINT,
            fingerprint: Fingerprint::of(&body),
            params: &body,
            request_id: &request_id,
            actor: crate::audit::Actor::Api,
        };
        let answer = StoredResponse { status: 201, body: b"{}".to_vec() };
        let expired = Deadline::counted_from(Duration::ZERO, Duration::from_secs(1));

        cache.remember(&new, &answer, expired);

        assert!(cache.recall(&Asked::from(&new)).is_none());
        assert!(!cache.holds(new.account_id, key.as_str()));
    }

    #[test]
    fn an_entry_is_served_until_its_key_expires_and_not_from_then_on() {
        let cache = ReplayCache::new(1 << 20);
        let key = IdempotencyKey::parse(b"order-1").unwrap();
        let body = serde_json::json!({});
        let request_id = RequestId::generate();
        let new = NewKey {
            account_id: Uuid::nil(),
            key: &key,
            endpoint: &ENDPOINT,
            fingerprint: Fingerprint::of(&body),
            params: &body,
            request_id: &request_id,
            actor: crate::audit::Actor::Api,
        };
        let answer = StoredResponse { status: 201, body: b"{}".to_vec() };
        let sent = since_boot();
        let expires = Deadline::counted_from(sent, Duration::from_secs(60));
        cache.remember(&new, &answer, expires);

        let (asked, before) = (Asked::from(&new), sent + Duration::from_secs(59));
        assert!(matches!(cache.recall_at(&asked, before), Some(Remembered::Replay(_))), "before the key expires");
        // The key expires 60 s after `sent` at the earliest, by the database's clock.
        assert!(cache.recall_at(&asked, sent + Duration::from_secs(60)).is_none(), "not once it has expired");
        assert_eq!(cache.weighed_bytes(), 0, "an expired entry found is let go of");
        assert!(cache.recall_at(&asked, before).is_none(), "and is gone");
    }

    #[test]
    fn the_largest_answer_is_held_however_many_cores_there_are() {
        let key = IdempotencyKey::parse("k".repeat(MAX_KEY_LENGTH).as_bytes()).unwrap();
        let body = serde_json::json!({});
        let request_id = RequestId::generate();
        let new = NewKey {
            account_id: Uuid::nil(),
            key: &key,
            endpoint: &ENDPOINT,
            fingerprint: Fingerprint::of(&body),
            params: &body,
            request_id: &request_id,
            actor: crate::audit::Actor::Api,
        };
        let answer = StoredResponse { status: 201, body: vec![b'x'; MAX_STORED_BODY_BYTES] };
        // The last: room for 65 shards of two. Rounded up to 128, each shard would be short of one
        // answer (quick_cache admits an entry up to 97 % of its shard).
        let sizes = [
            (4 << 20, 1),
            (4 << 20, 2),
            (4 << 20, 16),
            (4 << 20, 64),
            (4 << 20, 1024),
            (65 * 2 * HEAVIEST_ENTRY_BYTES, 64),
        ];
        for (max_bytes, cores) in sizes {
            let cache = ReplayCache::for_cores(max_bytes, cores);
            cache.remember(&new, &answer, Deadline::after(Duration::from_secs(60)));
            assert!(cache.holds(Uuid::nil(), key.as_str()), "{max_bytes} bytes on {cores} cores");
        }
    }

    #[test]
    fn a_lookup_hashes_as_the_entry_it_finds() {
        // quick_cache finds an entry by a `Lookup`'s hash: it must be the `Entry`'s.
        let hasher = DefaultHashBuilder::default();
        let account_id = Uuid::now_v7();
        let (entry, lookup) = (Entry { account_id, key: "order-1".into() }, Lookup { account_id, key: "order-1" });
        assert_eq!(hasher.hash_one(&entry), hasher.hash_one(&lookup));
        assert!(lookup.equivalent(&entry));
        let other = Lookup { account_id, key: "order-2" };
        assert!(!other.equivalent(&entry));
    }

    #[test]
    fn the_cache_stays_within_its_bytes() {
        let max_bytes = 64 * 1024;
        let cache = ReplayCache::new(max_bytes);
        let body = serde_json::json!({});
        let answer = StoredResponse { status: 201, body: vec![b'x'; 1024] };
        let request_id = RequestId::generate();
        for n in 0..1000 {
            let key = IdempotencyKey::parse(format!("key-{n}").as_bytes()).unwrap();
            let new = NewKey {
                account_id: Uuid::nil(),
                key: &key,
                endpoint: &ENDPOINT,
                fingerprint: Fingerprint::of(&body),
                params: &body,
                request_id: &request_id,
                actor: crate::audit::Actor::Api,
            };
            cache.remember(&new, &answer, Deadline::after(Duration::from_secs(60)));
        }
        assert!(cache.weighed_bytes() <= max_bytes, "{} bytes", cache.weighed_bytes());
    }
}
