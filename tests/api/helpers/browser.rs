//! Headless Chromium driven through chromedriver (WebDriver), for the
//! console's browser tests. Each test starts its own chromedriver on a free
//! port, with a fresh profile; the guard kills its whole process group
//! (chromedriver and the browsers it started) however the test ends.
//!
//! Chromium and chromedriver are Debian's (`make tools` installs them). A
//! machine without them FAILS these tests, naming `make tools`: a browser
//! test that passes without a browser would prove nothing.

use std::path::PathBuf;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

/// Where the screenshots of a run go (and, with
/// `FENCEHOOK_CONSOLE_SCREENSHOTS=<dir>`, a copy there: docs/console/).
pub fn screenshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots")
}

fn find(candidates: &[&str]) -> Option<PathBuf> {
    candidates.iter().map(PathBuf::from).find(|p| p.exists())
}

/// A browser session and its chromedriver.
pub struct Chrome {
    pub client: Client,
    driver: tokio::process::Child,
    profile: PathBuf,
}

impl Chrome {
    pub async fn start() -> Chrome {
        let missing = "the console's browser tests need Chromium and chromedriver \
                       (Debian: chromium, chromium-driver): run `make tools`";
        let browser = find(&["/usr/bin/chromium", "/usr/bin/chromium-browser"]).expect(missing);
        let driver_bin =
            find(&["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]).expect(missing);
        let profile =
            std::env::temp_dir().join(format!("fh-chrome-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&profile).unwrap();
        // A port nothing listens on now; taken by another process before
        // chromedriver binds it, the next attempt picks another.
        for _attempt in 0..5 {
            let port = crate::helpers::closed_port().await;
            let mut driver = tokio::process::Command::new(&driver_bin)
                .arg(format!("--port={port}"))
                .arg("--allowed-ips=")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .process_group(0)
                .kill_on_drop(true)
                .spawn()
                .expect("chromedriver starts");
            let url = format!("http://127.0.0.1:{port}");
            let caps = json!({
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": browser,
                    // As root in a container, on a closed network: no
                    // sandbox, no GPU, and none of the background
                    // connections Chromium would otherwise keep trying.
                    "args": [
                        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync",
                        "--disable-dev-shm-usage", "--window-size=1280,1000",
                        format!("--user-data-dir={}", profile.display()),
                    ],
                },
            });
            let caps = caps.as_object().unwrap().clone();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(Some(_)) = driver.try_wait() {
                    break; // the port was taken: try another
                }
                let connector = hyper_util::client::legacy::connect::HttpConnector::new();
                match ClientBuilder::new(connector)
                    .capabilities(caps.clone())
                    .connect(&url)
                    .await
                {
                    Ok(client) => {
                        return Chrome {
                            client,
                            driver,
                            profile,
                        }
                    }
                    Err(e) if tokio::time::Instant::now() >= deadline => {
                        panic!("chromedriver at {url} gave no browser session: {e}")
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
        panic!("chromedriver could not bind a port after five attempts");
    }

    /// Saves a PNG of the page as it is to the run's screenshot directory
    /// (and to `$FENCEHOOK_CONSOLE_SCREENSHOTS` when set).
    pub async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.expect("a screenshot");
        let mut dirs = vec![screenshot_dir()];
        if let Ok(extra) = std::env::var("FENCEHOOK_CONSOLE_SCREENSHOTS") {
            dirs.push(PathBuf::from(extra));
        }
        for dir in dirs {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("{name}.png")), &png).unwrap();
        }
    }

    /// The page's visible text. A click that submits a form navigates while
    /// the text is read (the body found is then stale): read again, within a
    /// deadline.
    pub async fn text(&self) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let read = match self.client.find(Locator::Css("body")).await {
                Ok(body) => body.text().await,
                Err(e) => Err(e),
            };
            match read {
                Ok(text) => return text,
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    panic!("the page's text could not be read: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// The current URL's path (and query).
    pub async fn path(&self) -> String {
        let url = self.client.current_url().await.expect("a URL");
        match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_owned(),
        }
    }

    /// Opens `url`.
    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// Clicks the element `at`.
    pub async fn click(&self, at: Locator<'_>) {
        self.client
            .find(at)
            .await
            .unwrap_or_else(|e| panic!("find {at:?}: {e}"))
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {at:?}: {e}"));
    }

    /// Types `text` into the field `css`.
    pub async fn fill(&self, css: &str, text: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("find {css}: {e}"))
            .send_keys(text)
            .await
            .unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    /// Waits (fantoccini's default deadline) until the element `at` shows.
    pub async fn wait_for(&self, at: Locator<'_>) {
        self.client
            .wait()
            .for_element(at)
            .await
            .unwrap_or_else(|e| panic!("wait for {at:?}: {e}"));
    }

    pub async fn close(self) {
        let Chrome { client, .. } = &self;
        let _ = client.clone().close().await;
    }
}

impl Drop for Chrome {
    fn drop(&mut self) {
        if let Some(pid) = self.driver.id() {
            // The group: chromedriver and every browser process it started.
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}
