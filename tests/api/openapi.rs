//! `openapi.yaml` and the app describe the same API.

use std::collections::BTreeSet;

use payments::http::problem::ProblemType;
use payments::http::{ENDPOINTS, OPENAPI_YAML};
use yaml_rust2::{Yaml, YamlLoader};

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
    let routed: BTreeSet<(String, String)> =
        ENDPOINTS.iter().map(|endpoint| (endpoint.method.to_string(), endpoint.path.to_owned())).collect();
    assert_eq!(routed, documented, "routes (left) and openapi.yaml operations (right) differ");
}

#[test]
fn every_problem_type_is_documented() {
    for kind in ProblemType::ALL {
        assert!(OPENAPI_YAML.contains(&kind.uri()), "openapi.yaml does not document {}", kind.uri());
    }
}

#[tokio::test]
async fn the_spec_is_served_as_it_is_in_the_repository() {
    let app = crate::helpers::TestApp::spawn().await;
    let served = app.http.get(format!("{}/openapi.yaml", app.address)).send().await.unwrap();
    assert_eq!(served.headers()["content-type"], "application/yaml");
    assert_eq!(
        served.text().await.unwrap(),
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml")).unwrap()
    );
}
