"""TLS, mTLS and basic auth from an exporter-toolkit web-config file: real HTTPS scrapes and a real Prometheus."""

from __future__ import annotations

import logging
import os
import ssl
import time
import urllib.request
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml

import rl_otel
from rl_otel import ConfigurationError
from rl_otel._internal.exporters.webconfig import BasicAuth, load_web_config
from tests.certs import Pki, make_pki
from tests.promtools import PrometheusServer, promtool_check, samples
from tests.test_endpoint_hardening import wait_until

pytestmark = pytest.mark.slow  # the slow layer (tests/conftest.py)

PASSWORD = "s3cret-scrape"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def hashed() -> str:
    return bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


def web_config(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


def serve(path: Path, **kwargs) -> rl_otel.Telemetry:
    tel = rl_otel.init(run="secure", rank=3, prometheus={"host": "127.0.0.1", "port": 0, "web_config_file": str(path)},
                       **kwargs)
    tel.log({"critic/score/mean": 0.25, "actor/approxkl": float("nan")}, step=7)
    return tel


def mtls_doc(pki: Pki, hashed: str | None = None, **tls) -> dict:
    doc = {"tls_server_config": {"cert_file": pki.server_cert.name, "key_file": pki.server_key.name,
                                 "client_auth_type": "RequireAndVerifyClientCert",
                                 "client_ca_file": str(pki.ca), **tls}}
    if hashed:
        doc["basic_auth_users"] = {"prometheus": hashed}
    return doc


def test_tls_scrape_is_verified_against_the_ca(tmp_path, pki):
    path = web_config(tmp_path, {"tls_server_config": {"cert_file": str(pki.server_cert),
                                                       "key_file": str(pki.server_key)},
                                 "http_server_config": {"headers": {"X-Frame-Options": "deny"}}})
    with serve(path) as tel:
        assert tel.metrics_url.startswith("https://127.0.0.1:")
        response = requests.get(tel.metrics_url, verify=str(pki.ca), timeout=10)
        assert response.status_code == 200
        assert response.headers["X-Frame-Options"] == "deny"
        assert samples(response.text, "rl_critic_score") == {
            frozenset({"run": "secure", "role": "trainer", "rank": "3", "stat": "mean"}.items()): 0.25}
        assert promtool_check(response.text) == ""
        with pytest.raises(requests.exceptions.SSLError):  # the system CAs do not trust the test CA
            requests.get(tel.metrics_url, timeout=10)
        with pytest.raises(requests.exceptions.ConnectionError):  # plain HTTP does not get through
            requests.get(tel.metrics_url.replace("https://", "http://"), timeout=10)


def test_mtls_refuses_a_missing_or_untrusted_client_certificate(tmp_path, pki):
    # cert_file/key_file relative to the web-config file's directory, as the toolkit resolves them
    path = web_config(pki.server_cert.parent, mtls_doc(pki))
    with serve(path) as tel:
        url = tel.metrics_url
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.get(url, verify=str(pki.ca), timeout=10)
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.get(url, verify=str(pki.ca), cert=(str(pki.stranger_cert), str(pki.stranger_key)), timeout=10)
        ok = requests.get(url, verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key)), timeout=10)
        assert ok.status_code == 200 and "rl_critic_score" in ok.text


def test_client_allowed_sans(tmp_path, pki):
    path = web_config(tmp_path, mtls_doc(pki, client_allowed_sans=["someone.else"],
                                         cert_file=str(pki.server_cert), key_file=str(pki.server_key)))
    with serve(path) as tel, pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
        requests.get(tel.metrics_url, verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key)),
                     timeout=10)
    path = web_config(tmp_path, mtls_doc(pki, client_allowed_sans=["prometheus.test"],
                                         cert_file=str(pki.server_cert), key_file=str(pki.server_key)))
    with serve(path) as tel:
        ok = requests.get(tel.metrics_url, verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key)),
                          timeout=10)
        assert ok.status_code == 200


def test_client_allowed_sans_with_non_ascii_names_compare_without_raising():
    from rl_otel._internal.exporters.webconfig import WebConfig

    config = WebConfig(path="web.yml", allowed_sans=frozenset({"nœud-7.cluster", "prometheus.test"}))
    assert config.san_allowed({"subjectAltName": (("DNS", "nœud-7.cluster"),)}) is True
    assert config.san_allowed({"subjectAltName": (("DNS", "prometheus.test"),)}) is True
    assert config.san_allowed({"subjectAltName": (("DNS", "nœud-8.cluster"), ("URI", "spiffe://ü"),
                                                  ("DirName", ((("commonName", "nœud-7.cluster"),),)))}) is False
    assert config.san_allowed(None) is False


def test_basic_auth_over_tls(tmp_path, pki, hashed):
    path = web_config(tmp_path, {"tls_server_config": {"cert_file": str(pki.server_cert),
                                                       "key_file": str(pki.server_key)},
                                 "basic_auth_users": {"prometheus": hashed}})
    with serve(path) as tel:
        get = lambda **kw: requests.get(tel.metrics_url, verify=str(pki.ca), timeout=10, **kw)
        assert get().status_code == 401
        assert get().headers["WWW-Authenticate"].startswith("Basic")
        assert get(auth=("prometheus", "wrong")).status_code == 401
        assert get(auth=("nobody", PASSWORD)).status_code == 401
        assert get(headers={"Authorization": "Basic !!notbase64"}).status_code == 401
        good = get(auth=("prometheus", PASSWORD))
        assert good.status_code == 200 and samples(good.text, "rl_step")


def test_bcrypt_verdicts_are_cached(monkeypatch, hashed):
    auth = BasicAuth({"prometheus": hashed.encode()})
    calls = []
    real = bcrypt.checkpw
    monkeypatch.setattr(bcrypt, "checkpw", lambda pw, h: calls.append(pw) or real(pw, h))
    assert [auth.check("prometheus", PASSWORD) for _ in range(5)] == [True] * 5
    assert [auth.check("prometheus", "wrong") for _ in range(3)] == [False] * 3
    assert auth.check("nobody", "x") is False  # an unknown user still costs one bcrypt check (timing)
    assert len(calls) == 3
    assert all(PASSWORD.encode() not in key for key in [*auth._ok, *auth._denied])  # digests only


def test_plain_http_basic_auth(tmp_path, hashed):
    path = web_config(tmp_path, {"basic_auth_users": {"prometheus": hashed}})
    with serve(path) as tel:
        assert tel.metrics_url.startswith("http://")
        assert requests.get(tel.metrics_url, timeout=10).status_code == 401
        assert requests.get(tel.metrics_url, auth=("prometheus", PASSWORD), timeout=10).status_code == 200


@pytest.mark.parametrize(("doc", "match"), [
    ({"basic_auth_users": {"u": "plaintext"}}, "bcrypt hash"),
    ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}}, "does not exist"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "client_auth_type": "RequestClientCert",
                            "client_ca_file": "{ca}"}}, "not supported"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "client_auth_type": "Sometimes"}},
     "client_auth_type must be one of"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}",
                            "client_auth_type": "RequireAndVerifyClientCert"}}, "needs client_ca_file"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "client_ca_file": "{ca}"}},
     "client_auth_type is NoClientCert"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "min_version": "TLS9"}}, "min_version"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{key}", "cipher_suites": ["RC4"]}}, "cipher_suites"),
    ({"tls_server_config": {"cert_file": "{crt}", "key_file": "{crt}"}}, "cannot load"),
    ({"http_server_config": {"headers": {"Server": "x"}}}, "headers may set only"),
    ({"tls_config": {}}, "unknown section"),
])
def test_bad_web_config_is_a_configuration_error(tmp_path, pki, doc, match):
    files = {"{crt}": str(pki.server_cert), "{key}": str(pki.server_key), "{ca}": str(pki.ca)}

    def fill(node):
        if isinstance(node, dict):
            return {k: fill(v) for k, v in node.items()}
        return files.get(node, node) if isinstance(node, str) else node

    web_config(tmp_path, fill(doc))
    with pytest.raises(ConfigurationError, match=match):
        rl_otel.init(run="r", prometheus={"host": "127.0.0.1", "port": 0, "web_config_file": str(tmp_path / "web.yml")})


def test_web_config_limits_tls_versions(tmp_path, pki):
    path = web_config(tmp_path, {"tls_server_config": {
        "cert_file": str(pki.server_cert), "key_file": str(pki.server_key), "min_version": "TLS13",
        "cipher_suites": ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"]}})
    assert load_web_config(path).tls.minimum_version is ssl.TLSVersion.TLSv1_3
    with serve(path) as tel:
        old = ssl.create_default_context(cafile=str(pki.ca))
        old.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(OSError):
            urllib.request.urlopen(tel.metrics_url, context=old, timeout=10)
        assert urllib.request.urlopen(tel.metrics_url, context=ssl.create_default_context(cafile=str(pki.ca)),
                                      timeout=10).status == 200


@pytest.mark.prometheus
def test_prometheus_scrapes_the_secured_endpoint(tmp_path, pki, hashed):
    """A real Prometheus with tls_config (CA, client certificate) and basic_auth scrapes the mTLS + auth endpoint;
    jobs missing the client certificate or with a wrong password are refused (up == 0)."""
    path = web_config(tmp_path, mtls_doc(pki, hashed, cert_file=str(pki.server_cert),
                                         key_file=str(pki.server_key)))
    with serve(path) as tel:
        target = tel.metrics_url.split("/")[2]
        tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}

        def job(name: str, tls_config: dict, password: str) -> dict:
            return {"job_name": name, "scheme": "https", "tls_config": tls_config,
                    "basic_auth": {"username": "prometheus", "password": password},
                    "static_configs": [{"targets": [target]}]}

        server = PrometheusServer(tmp_path, scrape_configs=[
            job("rl_otel", tls, PASSWORD), job("wrong_password", tls, "nope"),
            job("no_client_cert", {"ca_file": str(pki.ca)}, PASSWORD)])
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(server.query("up")) < 3:
                time.sleep(0.5)
            while time.monotonic() < deadline and not server.query('rl_critic_score{job="rl_otel"}'):
                time.sleep(0.5)
            ups = {r["metric"]["job"]: r["value"][1] for r in server.query("up")}
            assert ups == {"rl_otel": "1", "wrong_password": "0", "no_client_cert": "0"}
            [score] = server.query('rl_critic_score{job="rl_otel"}')
            assert (score["metric"]["run"], score["metric"]["rank"], score["value"][1]) == ("secure", "3", "0.25")
            [kl] = server.query('rl_actor_approx_kl{job="rl_otel"}')
            assert kl["value"][1] == "NaN"
        finally:
            server.close()


def test_the_example_web_config_serves(pki):
    """examples/web-config.yml, next to certificates with the names it uses, serves mTLS + basic auth."""
    import shutil

    example = Path(__file__).resolve().parent.parent / "examples" / "web-config.yml"
    path = pki.ca.parent / "web-config.yml"
    shutil.copy(example, path)
    with serve(path) as tel:
        client = {"verify": str(pki.ca), "cert": (str(pki.client_cert), str(pki.client_key)), "timeout": 10}
        assert requests.get(tel.metrics_url, auth=("prometheus", "wrong"), **client).status_code == 401
        ok = requests.get(tel.metrics_url, auth=("prometheus", "change-me"), **client)
        assert ok.status_code == 200 and ok.headers["X-Content-Type-Options"] == "nosniff"


def test_a_stalled_tls_client_does_not_block_scrapes(tmp_path, pki):
    """A client that connects and never handshakes holds only its own thread (prometheus_client's server would
    handshake on the accept thread and stall every later scrape)."""
    import socket

    path = web_config(tmp_path, {"tls_server_config": {"cert_file": str(pki.server_cert),
                                                       "key_file": str(pki.server_key)}})
    with serve(path) as tel:
        port = int(tel.metrics_url.rsplit(":", 1)[1].split("/")[0])
        stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        try:
            for _ in range(3):
                assert requests.get(tel.metrics_url, verify=str(pki.ca), timeout=5).status_code == 200
        finally:
            for s in stalled:
                s.close()


def replace(path: Path, text: str) -> None:
    new = path.with_suffix(".new")
    new.write_text(text)
    os.replace(new, path)


def reloads_refused(tel: rl_otel.Telemetry) -> float:
    return tel.value("rl_telemetry_errors_total", sink="prometheus", reason="web_config_reload") or 0.0


@pytest.mark.parametrize("text", ["", "# being written\n", "null\n", "basic_auth_users: {}\n", "basic_auth_users:\n",
                                  "http_server_config:\n  headers: {X-Frame-Options: deny}\n"],
                         ids=["empty", "comment", "null", "no_users", "users_null", "half_written"])
def test_a_reload_cannot_switch_basic_auth_off(tmp_path, hashed, text, caplog):
    """Before: each of these files read as a valid one without basic auth, and the endpoint served anyone."""
    path = web_config(tmp_path, {"basic_auth_users": {"prometheus": hashed}})
    with serve(path) as tel:
        assert requests.get(tel.metrics_url, timeout=10).status_code == 401
        replace(path, text)
        wait_until(lambda: reloads_refused(tel) == 1, what="the weaker file refused")
        assert requests.get(tel.metrics_url, timeout=10).status_code == 401
        assert requests.get(tel.metrics_url, auth=("prometheus", PASSWORD), timeout=10).status_code == 200
    assert any("weaken security" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.parametrize("tls", [{"client_auth_type": None, "client_ca_file": None, "client_allowed_sans": None},
                                 {"client_auth_type": "VerifyClientCertIfGiven"},
                                 {"client_allowed_sans": None}, {"min_version": "TLS12"}],
                         ids=["no_client_auth_type", "client_cert_optional", "no_sans", "lower_min_version"])
def test_a_reload_cannot_loosen_mtls(pki, tls):
    """Before: a tls_server_config section that lost client_auth_type (a partial write) turned mTLS off."""
    directory = pki.server_cert.parent
    strict = mtls_doc(pki, client_allowed_sans=["prometheus.test"], min_version="TLS13")
    path = web_config(directory, strict)
    with serve(path) as tel:
        url = tel.metrics_url
        client = {"verify": str(pki.ca), "timeout": 10}
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.get(url, **client)
        section = {k: v for k, v in {**strict["tls_server_config"], **tls}.items() if v is not None}
        replace(path, yaml.safe_dump({"tls_server_config": section}))
        wait_until(lambda: reloads_refused(tel) == 1, what="the weaker file refused")
        with pytest.raises((requests.exceptions.SSLError, requests.exceptions.ConnectionError)):
            requests.get(url, **client)
        assert requests.get(url, cert=(str(pki.client_cert), str(pki.client_key)), **client).status_code == 200
