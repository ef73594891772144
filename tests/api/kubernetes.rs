//! deploy/kubernetes as `kubectl apply -k` would send it: every object valid
//! against the Kubernetes 1.37 schemas (`kubernetes-validate --strict`, from
//! PyPI; `make test` installs it), and held to what the binary and the image
//! read — the probes on the admin port's paths, the ports the image listens
//! on, every variable a setting of `serve`, every file a setting names inside
//! a mounted Secret that holds it, the commands, the drain, and the
//! securityContext the container test runs the image under.
//!
//! The kustomization is rendered by the small reader below (the fields it
//! uses: `namespace`, `resources`, `images`; any other stops the test), and
//! compared with `kubectl kustomize` where kubectl is installed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use yaml_rust2::{Yaml, YamlLoader};

use crate::container::{image_shape, image_user};
use crate::deploy::{
    default_of, deploy_path, fencehook_command, on_path, port_of, serve_settings, Scratch,
};

fn manifest_path(name: &str) -> PathBuf {
    deploy_path("kubernetes").join(name)
}

/// YAML as JSON (keys as strings), to compare and index with serde_json.
fn to_json(yaml: &Yaml) -> Value {
    match yaml {
        Yaml::Real(r) => json!(r.parse::<f64>().expect("a number")),
        Yaml::Integer(i) => json!(i),
        Yaml::String(s) => json!(s),
        Yaml::Boolean(b) => json!(b),
        Yaml::Array(items) => Value::Array(items.iter().map(to_json).collect()),
        Yaml::Hash(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        other => format!("{other:?}"),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Yaml::Null => Value::Null,
        other => panic!("unexpected YAML {other:?}"),
    }
}

fn load_yaml(text: &str) -> Vec<Value> {
    YamlLoader::load_from_str(text)
        .expect("valid YAML")
        .iter()
        .map(to_json)
        .filter(|doc| !doc.is_null())
        .collect()
}

fn kustomization() -> Value {
    let path = manifest_path("kustomization.yaml");
    let docs = load_yaml(&std::fs::read_to_string(&path).unwrap());
    assert_eq!(docs.len(), 1);
    docs[0].clone()
}

fn resource_files() -> Vec<PathBuf> {
    kustomization()["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| manifest_path(r.as_str().expect("a file name")))
        .collect()
}

/// The pod spec of a workload, if it has one.
fn pod_spec_mut(object: &mut Value) -> Option<&mut Value> {
    match object["kind"].as_str()? {
        "Deployment" | "Job" => Some(&mut object["spec"]["template"]["spec"]),
        "CronJob" => Some(&mut object["spec"]["jobTemplate"]["spec"]["template"]["spec"]),
        _ => None,
    }
}

fn pod_spec(object: &Value) -> &Value {
    match object["kind"].as_str() {
        Some("Deployment" | "Job") => &object["spec"]["template"]["spec"],
        Some("CronJob") => &object["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        kind => panic!("{kind:?} has no pod"),
    }
}

/// What `kubectl kustomize deploy/kubernetes` gives, for the fields this
/// kustomization uses.
fn render() -> Vec<Value> {
    let k = kustomization();
    for key in k.as_object().unwrap().keys() {
        assert!(
            ["apiVersion", "kind", "namespace", "resources", "images"].contains(&key.as_str()),
            "kustomization.yaml uses `{key}`: teach this reader what it does"
        );
    }
    let namespace = k["namespace"].as_str().expect("namespace");
    let mut objects = Vec::new();
    for file in resource_files() {
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        objects.extend(load_yaml(&text));
    }
    for object in &mut objects {
        if object["kind"] != "Namespace" {
            object["metadata"]["namespace"] = json!(namespace);
        }
        let Some(spec) = pod_spec_mut(object) else {
            continue;
        };
        for container in spec["containers"].as_array_mut().unwrap() {
            for image in k["images"].as_array().into_iter().flatten() {
                if container["image"] == image["name"] {
                    container["image"] = json!(format!(
                        "{}:{}",
                        image["newName"].as_str().unwrap(),
                        image["newTag"].as_str().unwrap()
                    ));
                }
            }
        }
    }
    objects
}

fn object<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn workloads(objects: &[Value]) -> Vec<&Value> {
    objects
        .iter()
        .filter(|o| ["Deployment", "Job", "CronJob"].contains(&o["kind"].as_str().unwrap()))
        .collect()
}

fn the_container(object: &Value) -> &Value {
    let containers = pod_spec(object)["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

#[test]
fn the_kubernetes_manifests_validate_against_the_kubernetes_1_37_schemas() {
    // Fails rather than skips: a skipped test reads as a passed one.
    assert!(
        on_path("kubernetes-validate"),
        "kubernetes-validate is not installed: `make test` (or `make tools`) installs it"
    );
    let out = std::process::Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", "1.37.0"])
        .args(resource_files())
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let passed = said.matches(" passed for resource ").count();
    assert_eq!(passed, render().len(), "every object checked: {said}");
}

#[test]
fn the_kustomization_renders_as_kubectl_kustomize_renders_it() {
    let objects = render();
    let mut kinds: Vec<&str> = objects
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            "ConfigMap",
            "CronJob",
            "Deployment",
            "Deployment",
            "Job",
            "Namespace",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Secret",
            "Secret",
            "Secret",
            "Secret",
            "Service"
        ]
    );
    let image = format!("localhost/fencehook:{}", env!("CARGO_PKG_VERSION"));
    for workload in workloads(&objects) {
        assert_eq!(
            the_container(workload)["image"],
            json!(image),
            "make image's tag"
        );
    }
    if !on_path("kubectl") {
        eprintln!("SKIPPED the comparison with `kubectl kustomize`: kubectl is not installed");
        return;
    }
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(deploy_path("kubernetes"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = |o: &Value| (o["kind"].to_string(), o["metadata"]["name"].to_string());
    let mut theirs = load_yaml(&String::from_utf8_lossy(&out.stdout));
    let mut ours = objects;
    theirs.sort_by_key(key);
    ours.sort_by_key(key);
    assert_eq!(ours, theirs);
}

#[test]
fn serve_probes_its_admin_port_outlasts_the_drain_and_only_its_public_port_is_a_service() {
    let objects = render();
    let settings = serve_settings();
    let shape = image_shape("scripts/image.Containerfile");
    let public = port_of(&shape.env["FENCEHOOK_LISTEN"]);
    let admin = port_of(&shape.env["FENCEHOOK_ADMIN_LISTEN"]);

    let serve = object(&objects, "Deployment", "fencehook-serve");
    assert!(serve["spec"]["replicas"].as_u64().unwrap() >= 2);
    assert_eq!(
        serve["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
        0
    );
    let c = the_container(serve);
    assert_eq!(c["args"], json!(["serve"]));
    let ports: BTreeMap<&str, u64> = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap(),
                p["containerPort"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        BTreeMap::from([("admin", u64::from(admin)), ("public", u64::from(public))]),
        "the ports the image listens on"
    );
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "admin", "{probe}");
        // /readyz waits up to 2 s for each backend.
        assert!(c[probe]["timeoutSeconds"].as_u64().unwrap() > 2, "{probe}");
    }
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["limits"]["memory"].is_string());

    // The preStop pause, then the public drain and the inbox workers' own
    // (each up to FENCEHOOK_SHUTDOWN_TIMEOUT_MS), then margin.
    let drain = Duration::from_millis(default_of(&settings, "FENCEHOOK_SHUTDOWN_TIMEOUT_MS"));
    let pre_stop = Duration::from_secs(
        c["lifecycle"]["preStop"]["sleep"]["seconds"]
            .as_u64()
            .expect("a preStop sleep"),
    );
    let grace = |o: &Value| {
        Duration::from_secs(
            pod_spec(o)["terminationGracePeriodSeconds"]
                .as_u64()
                .unwrap(),
        )
    };
    assert!(grace(serve) > pre_stop + drain * 2 + Duration::from_secs(5));
    let work = object(&objects, "Deployment", "fencehook-work");
    assert_eq!(the_container(work)["args"], json!(["work"]));
    assert!(grace(work) > drain + Duration::from_secs(5));

    let selector = &serve["spec"]["selector"]["matchLabels"];
    let service = object(&objects, "Service", "fencehook");
    assert_eq!(&service["spec"]["selector"], selector);
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "public", "port": public, "targetPort": "public", "protocol": "TCP"}]),
        "the public port only"
    );
    let budget = object(&objects, "PodDisruptionBudget", "fencehook-serve");
    assert_eq!(&budget["spec"]["selector"]["matchLabels"], selector);
    assert_eq!(budget["spec"]["maxUnavailable"], 1);

    // The admin port only from inside the cluster (any namespace's pods, no
    // ipBlock), the public port from anywhere.
    let policy = object(&objects, "NetworkPolicy", "fencehook-serve");
    assert_eq!(&policy["spec"]["podSelector"]["matchLabels"], selector);
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let rules = policy["spec"]["ingress"].as_array().unwrap();
    let rule_for = |port: &str| {
        let found: Vec<&Value> = rules
            .iter()
            .filter(|r| {
                r["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p["port"] == port)
            })
            .collect();
        assert_eq!(found.len(), 1, "one rule for {port}");
        found[0]
    };
    assert!(
        rule_for("public")["from"].is_null(),
        "public: from anywhere"
    );
    assert_eq!(
        rule_for("admin")["from"],
        json!([{"namespaceSelector": {}}]),
        "admin: pods of the cluster only"
    );
}

#[test]
fn every_pod_runs_as_the_images_user_read_only_without_privileges_or_capabilities() {
    let objects = render();
    let (uid, gid) = image_user();
    let commands: BTreeMap<&str, &str> = workloads(&objects)
        .iter()
        .map(|w| {
            let name = w["metadata"]["name"].as_str().unwrap();
            (name, the_container(w)["args"][0].as_str().unwrap())
        })
        .collect();
    assert_eq!(
        commands,
        BTreeMap::from([
            ("fencehook-audit", "audit"),
            ("fencehook-migrate", "migrate"),
            ("fencehook-serve", "serve"),
            ("fencehook-work", "work"),
        ])
    );
    let namespace = object(&objects, "Namespace", "fencehook");
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    for workload in workloads(&objects) {
        let name = workload["metadata"]["name"].as_str().unwrap();
        let pod = pod_spec(workload);
        let sc = &pod["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true, "{name}");
        assert_eq!(sc["runAsUser"], uid, "{name}: the image's user");
        assert_eq!(sc["runAsGroup"], gid, "{name}");
        // Secret files are then owned by the process's own group (0440).
        assert_eq!(sc["fsGroup"], gid, "{name}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{name}");
        // A Service named fencehook would add FENCEHOOK_SERVICE_HOST and
        // such, which fencehook warns about as unknown settings.
        assert_eq!(pod["enableServiceLinks"], false, "{name}");
        assert_eq!(pod["automountServiceAccountToken"], false, "{name}");
        let c = &the_container(workload)["securityContext"];
        assert_eq!(c["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(c["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(c["runAsNonRoot"], true, "{name}");
        assert_eq!(c["capabilities"], json!({"drop": ["ALL"]}), "{name}");
        assert!(c["privileged"] != true, "{name}");
    }
}

/// (Secret name, key) → its `stringData` value.
fn secret_values(objects: &[Value]) -> BTreeMap<(String, String), String> {
    objects
        .iter()
        .filter(|o| o["kind"] == "Secret")
        .flat_map(|s| {
            let name = s["metadata"]["name"].as_str().unwrap().to_owned();
            s["stringData"]
                .as_object()
                .unwrap()
                .iter()
                .map(move |(k, v)| ((name.clone(), k.clone()), v.as_str().unwrap().to_owned()))
        })
        .collect()
}

/// Every file path a container can read from a Secret volume: mount path
/// plus key (or item path) → (Secret, key).
fn mounted_secret_files(workload: &Value) -> BTreeMap<String, (String, String)> {
    let pod = pod_spec(workload);
    let mut files = BTreeMap::new();
    for mount in the_container(workload)["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
    {
        assert_eq!(mount["readOnly"], true, "{mount}");
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("no volume {}", mount["name"]));
        let secret = &volume["secret"];
        let name = secret["secretName"]
            .as_str()
            .expect("a Secret volume")
            .to_owned();
        // 0440: the owner and fsGroup read; fencehook refuses a console
        // token others may read.
        assert_eq!(secret["defaultMode"], 0o440, "{volume}");
        let dir = mount["mountPath"].as_str().unwrap();
        match secret["items"].as_array() {
            Some(items) => {
                for item in items {
                    let key = item["key"].as_str().unwrap().to_owned();
                    files.insert(
                        format!("{dir}/{}", item["path"].as_str().unwrap()),
                        (name.clone(), key),
                    );
                }
            }
            None => {
                files.insert(format!("{dir}/*"), (name.clone(), String::new()));
            }
        }
    }
    files
}

/// The (Secret, key) a path in the container reads, if a mount gives it.
fn secret_file(files: &BTreeMap<String, (String, String)>, path: &str) -> Option<(String, String)> {
    if let Some(found) = files.get(path) {
        return Some(found.clone());
    }
    let (dir, key) = path.rsplit_once('/')?;
    files
        .get(&format!("{dir}/*"))
        .map(|(secret, _)| (secret.clone(), key.to_owned()))
}

#[test]
fn every_variable_is_a_setting_and_every_file_it_names_is_a_mounted_secret_key() {
    let objects = render();
    let settings = serve_settings();
    let secrets = secret_values(&objects);
    let config = object(&objects, "ConfigMap", "fencehook-settings");
    let shared: BTreeMap<String, String> = config["data"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().expect("a string").to_owned()))
        .collect();
    for workload in workloads(&objects) {
        let name = workload["metadata"]["name"].as_str().unwrap();
        let c = the_container(workload);
        let files = mounted_secret_files(workload);
        let mut env: BTreeMap<String, String> = BTreeMap::new();
        for from in c["envFrom"].as_array().into_iter().flatten() {
            assert_eq!(from["configMapRef"]["name"], "fencehook-settings", "{name}");
            env.extend(shared.clone());
        }
        for var in c["env"].as_array().unwrap() {
            let var_name = var["name"].as_str().unwrap().to_owned();
            let value = if let Some(value) = var["value"].as_str() {
                value.to_owned()
            } else {
                let r = &var["valueFrom"]["secretKeyRef"];
                let at = (
                    r["name"].as_str().unwrap().to_owned(),
                    r["key"].as_str().unwrap().to_owned(),
                );
                secrets
                    .get(&at)
                    .unwrap_or_else(|| {
                        panic!("{name}: {var_name} from {at:?}, which no Secret has")
                    })
                    .clone()
            };
            assert!(
                env.insert(var_name.clone(), value).is_none(),
                "{name}: {var_name} twice"
            );
        }
        assert!(env.contains_key("DATABASE_URL"), "{name}");
        for (var, value) in &env {
            assert!(
                settings.contains_key(var),
                "{name}: {var} is no setting of `serve --help`"
            );
            let mut paths: Vec<&str> = Vec::new();
            if var.ends_with("_FILE") || var == "FENCEHOOK_PROVIDERS" {
                paths.push(value);
            }
            // sslrootcert= of the database URL is a file too.
            if let Some(at) = value.find("sslrootcert=") {
                paths.push(
                    value[at + "sslrootcert=".len()..]
                        .split('&')
                        .next()
                        .unwrap(),
                );
            }
            for path in paths {
                let (secret, key) = secret_file(&files, path).unwrap_or_else(|| {
                    panic!("{name}: {var} names {path}, which no mounted Secret gives")
                });
                // The database's CA comes from the PostgreSQL operator, not this example.
                if secret != "fencehook-db-ca" {
                    assert!(
                        secrets.contains_key(&(secret.clone(), key.clone())),
                        "{name}: {path} is key {key} of Secret {secret}, which the example lacks"
                    );
                }
            }
        }
        // The owner's URL only for migrate (docs/operations.md, "Database roles").
        let owner = &secrets[&("fencehook-database".to_owned(), "owner-url".to_owned())];
        assert_eq!(
            env["DATABASE_URL"] == *owner,
            name == "fencehook-migrate",
            "{name}"
        );
    }
}

/// The example's placeholders are published: applied as they stand, the
/// start is refused naming the setting, and the providers file passes only
/// when development is said.
#[test]
fn the_example_secrets_stop_the_start_until_they_are_replaced() {
    let objects = render();
    let secrets = secret_values(&objects);
    let dir = Scratch::new("kubernetes");
    let providers = dir.join("providers.toml");
    let key = |secret: &str, key: &str| secrets[&(secret.to_owned(), key.to_owned())].clone();
    std::fs::write(&providers, key("fencehook-providers", "providers.toml")).unwrap();
    let check = |env: &[(&str, &std::path::Path)], allow: bool| {
        let mut cmd = fencehook_command();
        // A database to name (no built-in one); check-config connects to none.
        cmd.arg("check-config").env(
            "DATABASE_URL",
            "postgres://fencehook_app@db.invalid:5432/fencehook",
        );
        for (k, v) in env {
            cmd.env(k, v);
        }
        if allow {
            cmd.env("FENCEHOOK_ALLOW_PUBLISHED_SECRETS", "true");
        }
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = check(&[("FENCEHOOK_PROVIDERS", &providers)], false);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(": FENCEHOOK_PROVIDERS: ") && stderr.contains("published"),
        "{stderr}"
    );
    let (code, stderr) = check(&[("FENCEHOOK_PROVIDERS", &providers)], true);
    assert_eq!(code, Some(0), "{stderr}");

    for (setting, token) in [
        ("FENCEHOOK_CONSOLE_VIEWER_TOKEN_FILE", "viewer.token"),
        ("FENCEHOOK_CONSOLE_OPERATOR_TOKEN_FILE", "operator.token"),
    ] {
        let path = dir.join(token);
        std::fs::write(&path, key("fencehook-console", token)).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let (code, stderr) = check(
            &[("FENCEHOOK_PROVIDERS", &providers), (setting, &path)],
            true,
        );
        assert_eq!(code, Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(&format!(": {setting}: ")), "{stderr}");
        assert!(
            stderr.contains("a console token needs at least 32"),
            "{stderr}"
        );
    }
}
