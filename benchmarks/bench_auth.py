"""Cost of basic auth on a scrape: one bcrypt check (cost 10, htpasswd's default) without and with the verdict
cache, and whole scrapes of a plain, a TLS + basic-auth and an mTLS + basic-auth endpoint, measured in one run.

    python benchmarks/bench_auth.py [--n 200]
"""

from __future__ import annotations

import argparse
import pathlib
import ssl
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the checkout's rl_otel, not an install
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import bcrypt
import yaml
from common import Row, metrics_url

import rl_otel
from rl_otel._internal.exporters.webconfig import BasicAuth
from tests.certs import make_pki


def median_ms(fn, n: int) -> float:
    """The median over 5 rounds of ``n`` calls (ms a call)."""
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(rounds)


def measure(n: int) -> dict[str, float]:
    """ms: one bcrypt check uncached and cached; one scrape (new connection) of each endpoint kind."""
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=10))
    out = {"uncached": median_ms(lambda: bcrypt.checkpw(b"pw", hashed), 3)}
    auth = BasicAuth({"prometheus": hashed})
    out["cached"] = median_ms(lambda: auth.check("prometheus", "pw"), n * 10)

    tmp = pathlib.Path(tempfile.mkdtemp())
    pki = make_pki(tmp)
    tls = {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key)}
    users = {"prometheus": hashed.decode()}
    configs = {
        "plain http": None,
        "tls + basic auth": {"tls_server_config": tls, "basic_auth_users": users},
        "mtls + basic auth": {"tls_server_config": {**tls, "client_auth_type": "RequireAndVerifyClientCert",
                                                    "client_ca_file": str(pki.ca)}, "basic_auth_users": users},
    }
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    header = {"Authorization": "Basic cHJvbWV0aGV1czpwdw=="}  # prometheus:pw
    for name, doc in configs.items():
        prometheus = {"host": "127.0.0.1", "port": 0}
        if doc is not None:
            (tmp / "web.yml").write_text(yaml.safe_dump(doc))
            prometheus["web_config_file"] = str(tmp / "web.yml")
        with rl_otel.init(run="bench", prometheus=prometheus) as tel:
            tel.log({"critic/score/mean": 0.5}, step=1)
            request = urllib.request.Request(metrics_url(tel), headers=header)
            ctx = context if doc else None
            out[name] = median_ms(lambda r=request, c=ctx: urllib.request.urlopen(r, context=c).read(), n)
    return out


def rows(quick: bool = False) -> list[Row]:
    m = measure(40 if quick else 200)
    plain = "plain http scrape, new connection"
    return [
        Row("basic auth check, cached verdict", m["cached"], m["uncached"], "ms", "ratio <= 0.01",
            m["cached"] <= 0.01 * m["uncached"], "bcrypt check, cost 10"),
        *(Row(f"scrape, {name}, new connection", m[name], m["plain http"], "ms", "-", None, plain)
          for name in ("tls + basic auth", "mtls + basic auth")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="scrapes / cached checks per timing round (median of 5)")
    args = parser.parse_args()
    m = measure(args.n)
    print(f"bcrypt check (cost 10): {m['uncached']:.1f} ms uncached, {m['cached'] * 1e3:.1f} us cached "
          f"({m['uncached'] / m['cached']:,.0f}x)")
    for name in ("plain http", "tls + basic auth", "mtls + basic auth"):
        print(f"scrape, {name} (new connection each): {m[name]:.2f} ms")


if __name__ == "__main__":
    main()
