"""Certificates for the test cluster (openssl): CAs, server and client certificates, kubeconfigs."""

from __future__ import annotations

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


def write_kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str,
                     namespace: str = "default") -> Path:
    """A kubeconfig at ``path`` that names the CA, certificate and key files by absolute path.

    Paths, not ``*-data``: the Python client writes embedded data to temporary files it removes
    only at a clean exit, so every client killed by a test (a fault drill's SIGKILL) left a copy
    of the private key in /tmp. The files live as long as the cluster's state folder."""
    cfg = {
        "apiVersion": "v1", "kind": "Config", "preferences": {},
        "clusters": [{"name": "forge-dev", "cluster": {"server": server, "certificate-authority": str(ca.resolve())}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert.resolve()), "client-key": str(key.resolve())}}],
        "contexts": [{"name": f"{user}@forge-dev",
                      "context": {"cluster": "forge-dev", "user": user, "namespace": namespace}}],
        "current-context": f"{user}@forge-dev",
    }
    path.write_text(json.dumps(cfg, indent=2) + "\n")  # JSON is valid kubeconfig YAML
    path.chmod(0o600)
    return path
