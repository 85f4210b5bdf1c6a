"""Certificates for the test cluster (openssl): CAs, server and client certificates, kubeconfigs."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

from devkit.common import ClusterError


def openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {' '.join(args)}: {proc.stderr.strip()}")


def make_ca(d: Path, name: str, cn: str) -> None:
    openssl("req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "3650", "-subj", f"/CN={cn}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", cwd=d)


def issue_cert(d: Path, ca: str, name: str, subject: str, *, server_sans: str | None = None) -> None:
    """Sign ``<name>.crt``/``<name>.key`` with CA ``<ca>`` (a client cert unless ``server_sans``)."""
    openssl("req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=d)
    ext = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment"]
    ext.append("extendedKeyUsage=serverAuth" if server_sans else "extendedKeyUsage=clientAuth")
    if server_sans:
        ext.append(f"subjectAltName={server_sans}")
    (d / f"{name}.ext").write_text("\n".join(ext) + "\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", "365", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=d)
    (d / f"{name}.csr").unlink()
    (d / f"{name}.ext").unlink()


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str,
                     namespace: str = "default") -> Path:
    cfg = {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "forge-dev", "cluster": {"server": server, "certificate-authority-data": _b64(ca)}}],
        "users": [{"name": user, "user": {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}}],
        "contexts": [{"name": f"{user}@forge-dev",
                      "context": {"cluster": "forge-dev", "user": user, "namespace": namespace}}],
        "current-context": f"{user}@forge-dev",
    }
    path.write_text(json.dumps(cfg, indent=2) + "\n")  # JSON is valid kubeconfig YAML
    path.chmod(0o600)
    return path
