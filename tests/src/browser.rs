//! A real browser for end-to-end tests of billing-api's pages: Debian's
//! Chromium (`/usr/bin/chromium`, headless, `--no-sandbox` because tests
//! run as root), driven over WebDriver through a `chromedriver` the test
//! starts on a free port ([`Chromedriver`]; `scripts/ensure-tools.sh`
//! installs both). The driver runs in a process group of its own, so
//! dropping it kills Chromium too. [`Browser`] is one WebDriver session
//! with the few things a page test does: sign in through the form, read
//! a figure off the page as an exact decimal, the HTTP status of the page
//! shown, click, screenshot (kept under `target/screenshots/`), print to
//! PDF.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use rust_decimal::Decimal;
use serde_json::json;

use crate::process::free_port;
use crate::Service;

/// Where Debian's chromium-driver package puts the driver.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// Where Debian's chromium package puts the browser.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// A chromedriver on a free port, killed (with every Chromium it started)
/// when dropped. Its log is `chromedriver.log` in the directory given.
pub struct Chromedriver {
    service: Service,
    pub url: String,
    profiles: PathBuf,
}

impl Chromedriver {
    /// Starts the driver and waits until `/status` says it is ready.
    pub async fn start(dir: &Path) -> Self {
        for tool in [CHROMEDRIVER, CHROMIUM] {
            assert!(
                Path::new(tool).exists(),
                "{tool} is missing: run `bash scripts/ensure-tools.sh` (installs Debian's chromium and chromium-driver)"
            );
        }
        let port = free_port();
        let spec = devstack::process::Spec::new(
            "chromedriver",
            CHROMEDRIVER,
            dir.join("chromedriver.log"),
        )
        .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".into()]);
        let mut service = Service::spawn(spec).unwrap_or_else(|e| panic!("chromedriver: {e}"));
        let url = format!("http://127.0.0.1:{port}");
        let status = format!("{url}/status");
        let http = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(res) = http.get(&status).send().await {
                if let Ok(v) = res.json::<serde_json::Value>().await {
                    if v["value"]["ready"] == true {
                        break;
                    }
                }
            }
            if let Err(e) = service.check_running() {
                panic!("chromedriver exited: {e}\n{}", service.log_tail());
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "chromedriver did not get ready on {url} within 30 s:\n{}",
                service.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self {
            service,
            url,
            profiles: dir.join("chromium-profiles"),
        }
    }

    /// A new headless Chromium session, 1280×900, opening pages under `base`.
    /// `name` names its screenshot folder (`target/screenshots/<name>/`).
    pub async fn browser(&self, base: &str, name: &str) -> Browser {
        let profile = self.profiles.join(name);
        std::fs::create_dir_all(&profile).expect("chromium profile dir");
        let mut caps = Capabilities::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,900",
                    "--hide-scrollbars",
                    "--no-first-run",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "a Chromium session through {}: {e}\n{}",
                    self.url,
                    self.service.log_tail()
                )
            });
        let shots = screenshot_dir().join(name);
        std::fs::create_dir_all(&shots).expect("screenshot dir");
        Browser {
            client,
            base: base.trim_end_matches('/').to_owned(),
            shots,
        }
    }
}

/// `target/screenshots/` of this checkout (or of `CARGO_TARGET_DIR`).
pub fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")),
        PathBuf::from,
    );
    target.join("screenshots")
}

/// One browser session on billing-api's pages.
pub struct Browser {
    pub client: Client,
    base: String,
    shots: PathBuf,
}

impl Browser {
    /// Opens `path` (e.g. `/pages/invoices`) and waits for it to load.
    pub async fn open(&self, path: &str) {
        let url = format!("{}{path}", self.base);
        self.client
            .goto(&url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// Signs in through the sign-in form with `token`, as a person would:
    /// types it into the password field and presses the button. Panics
    /// unless the browser left the sign-in page.
    pub async fn sign_in(&self, token: &str) {
        self.open("/sign-in").await;
        self.find("input[name=token]")
            .await
            .send_keys(token)
            .await
            .expect("type the token");
        self.click("form[action='/sign-in'] button[type=submit]")
            .await;
        let path = self.path().await;
        assert_ne!(
            path,
            "/sign-in",
            "signing in failed: {}",
            self.text("main").await
        );
    }

    /// The path (and query) of the page shown.
    pub async fn path(&self) -> String {
        let url = self.client.current_url().await.expect("current url");
        match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        }
    }

    /// The HTTP status of the response the page shown was loaded from
    /// (Navigation Timing's `responseStatus`).
    pub async fn status(&self) -> u16 {
        let v = self
            .client
            .execute(
                "return performance.getEntriesByType('navigation')[0].responseStatus;",
                vec![],
            )
            .await
            .expect("navigation timing");
        let status = v.as_u64().unwrap_or_else(|| panic!("responseStatus {v}"));
        u16::try_from(status).unwrap_or_else(|_| panic!("responseStatus {status}"))
    }

    /// The element matching `css`, or a panic naming it and showing the page.
    pub async fn find(&self, css: &str) -> fantoccini::elements::Element {
        match self.client.find(Locator::Css(css)).await {
            Ok(e) => e,
            Err(e) => panic!(
                "no {css} on {}: {e}\n{}",
                self.path().await,
                self.source_text().await
            ),
        }
    }

    /// Every element matching `css`.
    pub async fn find_all(&self, css: &str) -> Vec<fantoccini::elements::Element> {
        self.client
            .find_all(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("find {css}: {e}"))
    }

    /// Whether anything on the page matches `css`.
    pub async fn has(&self, css: &str) -> bool {
        !self.find_all(css).await.is_empty()
    }

    /// The visible text of the element matching `css`.
    pub async fn text(&self, css: &str) -> String {
        self.find(css)
            .await
            .text()
            .await
            .unwrap_or_else(|e| panic!("text of {css}: {e}"))
    }

    /// The amount shown in the element matching `css` (`$1,234.56` →
    /// 1234.56, `-$0.25` → -0.25), exactly.
    pub async fn amount(&self, css: &str) -> Decimal {
        let text = self.text(css).await;
        parse_amount(&text).unwrap_or_else(|| panic!("{css} shows {text:?}, not an amount"))
    }

    /// Clicks the element matching `css` (a link or a submit button) and
    /// waits until the browser shows the page that loads: a new document
    /// (the old one carried a marker the new one lacks), fully loaded.
    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        self.client
            .execute("window.__meterline_old_page = true;", vec![])
            .await
            .expect("mark the page");
        element
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let state = self
                .client
                .execute(
                    "return window.__meterline_old_page === true ? 'old' : document.readyState;",
                    vec![],
                )
                .await;
            if matches!(&state, Ok(v) if v == "complete") {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "clicking {css} loaded no new page within 20 s: {state:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Ticks the checkbox matching `css` (nothing loads).
    pub async fn tick(&self, css: &str) {
        let element = self.find(css).await;
        element
            .click()
            .await
            .unwrap_or_else(|e| panic!("tick {css}: {e}"));
        assert!(
            element.is_selected().await.expect("checked"),
            "{css} is not ticked"
        );
    }

    /// Types `text` into the field matching `css` (after clearing it).
    pub async fn fill(&self, css: &str, text: &str) {
        let field = self.find(css).await;
        field.clear().await.expect("clear the field");
        field
            .send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// The page's visible text (for failure messages).
    pub async fn source_text(&self) -> String {
        match self.client.find(Locator::Css("body")).await {
            Ok(body) => body.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// Saves a PNG of the viewport as `target/screenshots/<name>/<file>.png`
    /// and returns its path.
    pub async fn screenshot(&self, file: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("screenshot");
        let path = self.shots.join(format!("{file}.png"));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        path
    }

    /// Like [`screenshot`](Self::screenshot), of the whole page: the
    /// window is made as tall as the document for the shot, then restored.
    pub async fn screenshot_full_page(&self, file: &str) -> PathBuf {
        let (width, height) = self.client.get_window_size().await.expect("window size");
        let v = self
            .client
            .execute(
                "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight];",
                vec![],
            )
            .await
            .expect("page height");
        let page = v[0].as_u64().expect("scrollHeight");
        let chrome = v[1].as_u64().unwrap_or(0);
        let tall = u32::try_from(page + chrome).expect("a page height");
        let width = u32::try_from(width).expect("a window width");
        self.client
            .set_window_size(width, tall)
            .await
            .expect("resize the window");
        let path = self.screenshot(file).await;
        self.client
            .set_window_size(width, u32::try_from(height).expect("a window height"))
            .await
            .expect("restore the window");
        path
    }

    /// The page shown, printed to PDF by the browser (WebDriver's Print
    /// command, A4-ish defaults), also saved beside the screenshots.
    pub async fn print_pdf(&self, file: &str) -> Vec<u8> {
        let config = fantoccini::wd::PrintConfiguration::builder()
            .background(true)
            .build()
            .expect("print configuration");
        let pdf = self.client.print(config).await.expect("print to PDF");
        let path = self.shots.join(format!("{file}.pdf"));
        std::fs::write(&path, &pdf).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        pdf
    }

    /// Ends the session (Chromium quits).
    pub async fn close(self) {
        let _ = self.client.close().await;
    }
}

/// `$1,234.56` → 1234.56; `-$0.25` → -0.25; `EUR 1,000.00` → 1000.00.
pub fn parse_amount(text: &str) -> Option<Decimal> {
    let t = text.trim();
    let (negative, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t),
    };
    let digits: String = t
        .trim_start_matches(|c: char| !c.is_ascii_digit())
        .chars()
        .filter(|c| *c != ',')
        .collect();
    if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return None;
    }
    let v: Decimal = digits.parse().ok()?;
    Some(if negative { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::parse_amount;
    use rust_decimal::Decimal;

    #[test]
    fn amounts_parse_exactly() {
        assert_eq!(parse_amount("$1,234.56"), Some(Decimal::new(123_456, 2)));
        assert_eq!(parse_amount("-$0.25"), Some(Decimal::new(-25, 2)));
        assert_eq!(parse_amount("EUR 1,000.00"), Some(Decimal::new(100_000, 2)));
        assert_eq!(parse_amount("$0.00"), Some(Decimal::new(0, 2)));
        assert_eq!(parse_amount("n/a"), None);
        assert_eq!(parse_amount("$1.2.3"), None);
    }
}
