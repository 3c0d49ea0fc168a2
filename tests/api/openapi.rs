//! `openapi.yaml` and the app describe the same API.

use std::collections::BTreeSet;

use payments_service::audit::Actor;
use payments_service::http::{OPENAPI_YAML, routes};
use payments_service::idempotency::IdempotencyKey;
use payments_service::idempotency::RecoveryPoint;
use payments_service::payments::CreatePaymentBody;
use payments_service::refunds::RefundStatus;
use payments_service::story::TRAIL_LIMIT;
use payments_wire::problem::ProblemType;
use regex::Regex;
use reqwest::StatusCode;
use serde_json::{Value, json};
use yaml_rust2::{Yaml, YamlLoader};

use crate::helpers::{TestApp, new_key, payment_body};

fn spec() -> Yaml {
    YamlLoader::load_from_str(OPENAPI_YAML).expect("openapi.yaml is YAML").remove(0)
}

#[test]
fn every_route_is_in_the_spec_and_every_operation_in_the_spec_is_a_route() {
    const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];
    let spec = spec();
    assert_eq!(spec["openapi"].as_str(), Some("3.1.0"));
    let mut documented = BTreeSet::new();
    for (path, item) in spec["paths"].as_hash().expect("paths") {
        for (method, _) in item.as_hash().expect("a path item") {
            let method = method.as_str().unwrap();
            if METHODS.contains(&method) {
                documented.insert((method.to_uppercase(), path.as_str().unwrap().to_owned()));
            }
        }
    }
    let routes = routes(payments_service::endpoints::KEYED);
    let routed: BTreeSet<(String, String)> =
        routes.iter().map(|endpoint| (endpoint.method.to_string(), endpoint.path.to_owned())).collect();
    assert_eq!(routed, documented, "routes (left) and openapi.yaml operations (right) differ");
}

#[test]
fn every_problem_type_is_documented() {
    for kind in ProblemType::ALL {
        assert!(OPENAPI_YAML.contains(&kind.uri()), "openapi.yaml does not document {}", kind.uri());
    }
}

#[test]
fn the_spec_and_the_parser_accept_the_same_idempotency_keys() {
    let spec = spec();
    let pattern = spec["components"]["parameters"]["IdempotencyKey"]["schema"]["pattern"].as_str();
    let pattern = Regex::new(pattern.expect("the key's schema has a pattern")).unwrap();
    // Every value of up to five characters made of those that matter, then the length limits.
    let mut values = vec![String::new()];
    for length in 1..=5 {
        let shorter: Vec<String> = values.iter().filter(|value| value.chars().count() == length - 1).cloned().collect();
        values
            .extend(shorter.iter().flat_map(|value| ["k", " ", "\"", "\\", "\t", "é"].map(|c| format!("{value}{c}"))));
    }
    let quoted = |key: String| format!("\"{key}\"");
    values.extend([
        "k".repeat(255),
        "k".repeat(256),
        quoted("k".repeat(255)),
        quoted("k".repeat(256)),
        quoted(format!("{}{}", r#"\""#.repeat(200), "k".repeat(55))),
        quoted(format!("{}{}", r#"\\"#.repeat(200), "k".repeat(56))),
    ]);
    for value in values {
        assert_eq!(pattern.is_match(&value), IdempotencyKey::parse(value.as_bytes()).is_ok(), "{value:?}");
    }
}

#[test]
fn the_spec_caps_a_keys_trail_where_the_code_does() {
    let spec = spec();
    let trail = &spec["components"]["schemas"]["KeyStory"]["properties"]["trail"];
    assert_eq!(trail["maxItems"].as_i64(), Some(i64::from(TRAIL_LIMIT)));
}

/// The values the API shows from its stored enums are the ones the spec lets a client expect: a
/// new actor or recovery point is a change of the contract.
#[test]
fn the_spec_lists_every_value_of_the_stored_enums() {
    fn listed(schema: &Yaml) -> Vec<String> {
        schema["enum"].as_vec().expect("an enum").iter().map(|value| value.as_str().unwrap().to_owned()).collect()
    }
    let spec = spec();
    let schemas = &spec["components"]["schemas"];
    let shown = |values: Vec<&str>| values.into_iter().map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(
        listed(&schemas["AuditEntry"]["properties"]["actor"]),
        shown(Actor::ALL.iter().map(|actor| actor.as_str()).collect())
    );
    assert_eq!(
        listed(&schemas["KeyStory"]["properties"]["recovery_point"]),
        shown(recovery_points().iter().map(|point| point.as_str()).collect())
    );
    assert_eq!(
        listed(&schemas["Refund"]["properties"]["status"]),
        shown(RefundStatus::ALL.iter().map(|status| status.as_str()).collect())
    );
}

#[test]
fn the_spec_lists_the_currencies_the_api_charges_with_their_largest_amounts() {
    let spec = spec();
    let schema = &spec["components"]["schemas"]["CreatePayment"];
    let codes = |list: &Yaml| -> BTreeSet<String> {
        list.as_vec().expect("a list of codes").iter().map(|code| code.as_str().unwrap().to_owned()).collect()
    };
    let listed = codes(&schema["properties"]["currency"]["enum"]);
    let without_minor_units = codes(&schema["if"]["properties"]["currency"]["enum"]);
    let largest_amount = |code: &str| {
        let bounds = if without_minor_units.contains(code) { &schema["then"] } else { schema };
        bounds["properties"]["amount"]["maximum"].as_i64().unwrap()
    };
    let accepts = |currency: &str, amount: i64| {
        let body = json!({ "amount": amount, "currency": currency, "source": "tok_visa" });
        serde_json::from_value::<CreatePaymentBody>(body).unwrap().validate().is_ok()
    };
    let letters = || b'a'..=b'z';
    for code in letters().flat_map(|a| letters().flat_map(move |b| letters().map(move |c| [a, b, c]))) {
        let lower = String::from_utf8(code.to_vec()).unwrap();
        let capitalised = format!("{}{}", lower[..1].to_uppercase(), &lower[1..]);
        for currency in [lower.to_uppercase(), capitalised, lower] {
            let is_listed = listed.contains(&currency);
            assert_eq!(accepts(&currency, 1), is_listed, "{currency}");
            if is_listed {
                let max = largest_amount(&currency);
                assert!(accepts(&currency, max) && !accepts(&currency, max + 1), "{currency} up to {max}");
            }
        }
    }
}

#[tokio::test]
async fn the_spec_is_served_as_it_is_in_the_repository() {
    let app = crate::helpers::TestApp::spawn().await;
    let served = app.http.get(format!("{}/openapi.yaml", app.address)).send().await.unwrap();
    assert_eq!(served.headers()["content-type"], "application/yaml");
    let served = served.text().await.unwrap();
    assert_eq!(served, std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml")).unwrap());

    // The spec describes what a client parses out of the YAML: a document, not a string.
    let spec = spec();
    let described = &spec["paths"]["/openapi.yaml"]["get"]["responses"]["200"]["content"]["application/yaml"]["schema"];
    assert_eq!(described["type"].as_str(), Some("object"));
    let document = YamlLoader::load_from_str(&served).unwrap().remove(0);
    for field in described["required"].as_vec().expect("required fields") {
        assert!(!document[field.as_str().unwrap()].is_badvalue(), "{field:?}");
    }
}

/// A `null` is a value only where the spec says a request field is nullable; anywhere else it is
/// a 400 that writes nothing, so that a refund's amount lost on its way (many serialisers write an
/// unset field as `null`) never means "all that is left". Every optional field of every request
/// body the API reads under an idempotency key is tried; a new body needs its smallest valid form
/// below before this test passes.
#[tokio::test]
async fn a_request_field_takes_null_only_where_the_spec_says_it_is_nullable() {
    let app = TestApp::spawn().await;
    let spec = spec();
    let mut tried = 0;
    let endpoint = json!({ "url": "http://127.0.0.1:9/hooks", "enabled_events": ["*"] });
    for (path, item) in spec["paths"].as_hash().expect("paths") {
        let path = path.as_str().unwrap();
        let Some(body) = item["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"].as_str() else {
            continue;
        };
        if !path.starts_with("/v1/") {
            continue;
        }
        let name = body.rsplit('/').next().unwrap();
        let schema = &spec["components"]["schemas"][name];
        let required: BTreeSet<&str> =
            schema["required"].as_vec().into_iter().flatten().map(|field| field.as_str().unwrap()).collect();
        for (field, property) in schema["properties"].as_hash().expect("properties") {
            let field = field.as_str().unwrap();
            if required.contains(field) {
                continue;
            }
            let nullable =
                property["type"].as_vec().is_some_and(|types| types.iter().any(|t| t.as_str() == Some("null")));
            // A payment of its own for each case, so that one case's refund (or capture, or
            // cancel) takes nothing from the next's.
            let authorize = matches!(name, "CapturePayment" | "CancelPayment");
            let payment = match authorize {
                false => app.paid(5000, "tok_visa").await,
                true => {
                    let authorization =
                        json!({ "amount": 5000, "currency": "usd", "source": "tok_visa", "capture": false });
                    app.post_payment(&new_key(), &authorization).await.json().await.unwrap()
                }
            };
            let (mut sent, done) = match name {
                "CreatePayment" => (payment_body(), StatusCode::CREATED),
                "CreateRefund" => (json!({ "payment": payment["id"] }), StatusCode::CREATED),
                "CapturePayment" | "CancelPayment" => (json!({}), StatusCode::OK),
                "CreateWebhookEndpoint" => (endpoint.clone(), StatusCode::CREATED),
                "UpdateWebhookEndpoint" => (json!({ "status": "enabled" }), StatusCode::OK),
                "RotateWebhookSecret" => (json!({}), StatusCode::OK),
                other => panic!("no smallest valid body for the request schema {other}: add one here"),
            };
            sent[field] = Value::Null;
            let key = new_key();
            // The resource the path names: a webhook endpoint's, or the payment.
            let named = match path.starts_with("/v1/webhook_endpoints/") {
                true => {
                    let url = format!("{}/v1/webhook_endpoints", app.address);
                    let made = app.http.post(url).bearer_auth(&app.api_key).header("Idempotency-Key", new_key());
                    let made: Value = made.json(&endpoint).send().await.unwrap().json().await.unwrap();
                    made["id"].as_str().unwrap().to_owned()
                }
                false => payment["id"].as_str().unwrap().to_owned(),
            };
            let path = path.replace("{id}", &named);
            let response = app
                .http
                .post(format!("{}{path}", app.address))
                .bearer_auth(&app.api_key)
                .header("Idempotency-Key", &key)
                .json(&sent)
                .send()
                .await
                .unwrap();
            let status = response.status();
            let answer: Value = response.json().await.unwrap();
            if nullable {
                assert_eq!(status, done, "{path} {sent}: {answer}");
            } else {
                assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {sent}: {answer}");
                assert_eq!(answer["type"], "https://payments.example/problems/malformed-body", "{answer}");
                assert!(app.key_row(&key).await.is_none(), "{path} {sent}: the key was spent");
                let now: Value =
                    app.get(&format!("/v1/payments/{}", payment["id"].as_str().unwrap())).await.json().await.unwrap();
                assert_eq!(now["amount_refunded"], 0, "{path} {sent}: money moved");
                if authorize {
                    assert_eq!(now["status"], "requires_capture", "{path} {sent}: the authorization ended");
                }
            }
            tried += 1;
        }
    }
    // The payment's description, metadata and capture, the refund's amount, reason and metadata,
    // the capture's amount and the cancel's reason; a webhook endpoint's description, what an
    // update may change, and a rotation's `expires_in`.
    assert!(tried >= 14, "only {tried} optional request fields found in the spec");
}

/// Every point a key may stand at: `started`, each registered endpoint's own, in the registry's
/// order, and `finished`.
fn recovery_points() -> Vec<RecoveryPoint> {
    let own = payments_service::endpoints::all().into_iter().flat_map(|endpoint| endpoint.points.iter().copied());
    std::iter::once(RecoveryPoint::STARTED).chain(own).chain([RecoveryPoint::FINISHED]).collect()
}
