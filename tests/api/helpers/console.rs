//! The operator console's test kit: token files, a console-enabled app,
//! and an HTTP client that keeps a session cookie.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use bytes::Bytes;
use fencehook::config::console::{read_tokens, ConsoleConfig};
use fencehook::config::Config;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use super::client;

/// A viewer and an operator token, in private files of a temporary directory.
pub struct TokenFiles {
    pub dir: PathBuf,
    pub viewer: String,
    pub operator: String,
}

impl TokenFiles {
    pub fn new() -> TokenFiles {
        let dir =
            std::env::temp_dir().join(format!("fh-console-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = TokenFiles {
            dir,
            viewer: format!("viewer-{}", uuid::Uuid::new_v4().simple()),
            operator: format!("operator-{}", uuid::Uuid::new_v4().simple()),
        };
        files.write("viewer", &files.viewer);
        files.write("operator", &files.operator);
        files
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes `token` (and a newline, as `echo` would) to the file `name`, mode 600.
    pub fn write(&self, name: &str, token: &str) {
        let p = self.path(name);
        std::fs::write(&p, format!("{token}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    pub fn config(&self) -> ConsoleConfig {
        let (viewer, operator) =
            read_tokens(Some(&self.path("viewer")), Some(&self.path("operator"))).unwrap();
        ConsoleConfig {
            viewer,
            operator,
            secure_cookie: false,
        }
    }

    /// `cfg` with the console on.
    pub fn enable(&self, mut cfg: Config) -> Config {
        cfg.console = self.config();
        cfg
    }
}

impl Drop for TokenFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the console answered.
#[derive(Debug, Clone)]
pub struct Page {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub text: String,
}

impl Page {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    }

    /// The value of the session cookie this answer sets, if any.
    pub fn session_cookie(&self) -> Option<String> {
        let set = self.header("set-cookie")?;
        let (pair, _) = set.split_once(';')?;
        let (name, value) = pair.split_once('=')?;
        (name == "fencehook_console" && !value.is_empty()).then(|| value.to_owned())
    }

    /// The `csrf` field of the page's forms.
    pub fn csrf(&self) -> Option<String> {
        let at = self.text.find("name=\"csrf\" value=\"")? + "name=\"csrf\" value=\"".len();
        Some(self.text[at..].split('"').next()?.to_owned())
    }
}

/// One console user: the admin address and, once signed in, a session cookie.
#[derive(Clone)]
pub struct Browser {
    pub admin: String,
    pub cookie: Option<String>,
}

impl Browser {
    pub fn new(admin: &str) -> Browser {
        Browser {
            admin: admin.to_owned(),
            cookie: None,
        }
    }

    pub async fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Page {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.admin));
        if let Some(c) = &self.cookie {
            req = req.header("cookie", format!("fencehook_console={c}"));
        }
        if method == "POST" {
            req = req.header("content-type", "application/x-www-form-urlencoded");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = client()
            .request(req.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
            .await
            .expect("the admin listener answers");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        Page {
            status,
            headers,
            text: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    pub async fn get(&self, path: &str) -> Page {
        self.request("GET", path, &[], "").await
    }

    pub async fn get_json(&self, path: &str) -> Page {
        self.request("GET", path, &[("accept", "application/json")], "")
            .await
    }

    /// Posts a form (`fields` URL-encoded).
    pub async fn post(
        &self,
        path: &str,
        fields: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> Page {
        let body = form(fields);
        self.request("POST", path, headers, &body).await
    }

    /// Signs in with `token`; keeps the cookie. Panics unless it is a 303.
    pub async fn sign_in(&mut self, token: &str) -> Page {
        let page = self.post("/console/login", &[("token", token)], &[]).await;
        assert_eq!(page.status, 303, "sign-in: {}", page.text);
        self.cookie = page.session_cookie();
        assert!(self.cookie.is_some(), "a session cookie");
        page
    }

    /// A CSRF token of this session (from the overview's sign-out form).
    pub async fn csrf(&self) -> String {
        self.get("/console").await.csrf().expect("a csrf field")
    }
}

pub fn form(fields: &[(&str, &str)]) -> String {
    let mut s = form_urlencoded::Serializer::new(String::new());
    for (k, v) in fields {
        s.append_pair(k, v);
    }
    s.finish()
}
