//! Reading `GET /metrics` the way Prometheus does: samples by name and labels.

/// One scrape.
#[derive(Debug)]
pub struct Scrape(pub String);

impl Scrape {
    pub async fn of(url: &str) -> Scrape {
        let response = reqwest::get(url).await.expect("scraping /metrics");
        assert_eq!(response.status(), 200);
        let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
        Scrape(response.text().await.unwrap())
    }

    /// What a process with `state` would answer at `GET /metrics`.
    pub async fn of_state(state: &payments_service::state::AppState) -> Scrape {
        Scrape(state.metrics.render(&state.db).await)
    }

    /// The sample `name` whose labels include `labels`, or none if there is no such line.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples(name, labels).next()
    }

    /// The samples `name` whose labels include `labels`.
    fn samples<'s>(&'s self, name: &'s str, labels: &'s [(&str, &str)]) -> impl Iterator<Item = f64> + 's {
        self.0.lines().filter(|line| !line.starts_with('#')).filter_map(move |line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (series_name, series_labels) = match series.split_once('{') {
                Some((series_name, rest)) => (series_name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let matches = series_name == name
                && labels
                    .iter()
                    .all(|(label, value)| series_labels.split(',').any(|l| l == format!("{label}=\"{value}\"")));
            matches.then(|| value.parse().unwrap())
        })
    }

    /// A counter: like [`Scrape::get`], with an absent sample counting as 0 (a counter not yet
    /// moved).
    /// Summed over every sample whose labels include `labels` (every endpoint's, say).
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples(name, labels).sum()
    }
}
