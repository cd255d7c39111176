"""Protobuf request bodies as kubectl sends them read as the objects they encode."""

from __future__ import annotations

import pytest

from tpuflow_rehearsal.standins import kube_protobuf

# `kubectl create secret generic hf-secret --from-literal=hf_api_token=x` (kubectl v1.33.1), as sent on the wire.
KUBECTL_SECRET = bytes.fromhex(
    "6b3873000a0c0a027631120653656372657412300a190a0968662d73656372657412001a0022002a003200380042"
    "0012110a0c68665f6170695f746f6b656e1201781a001a002200"
)


def test_kubectls_secret_reads_as_its_json_form() -> None:
    assert kube_protobuf.decode(KUBECTL_SECRET) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hf-secret"},
        "data": {"hf_api_token": "eA=="},  # base64, as the JSON form carries Secret data
    }


def test_a_kind_the_standin_does_not_read_is_refused_by_name() -> None:
    pod = kube_protobuf.MAGIC + bytes.fromhex("0a090a0276311203506f64")  # typeMeta {v1, Pod}, no raw
    with pytest.raises(kube_protobuf.ProtobufBodyError, match="not 'Pod'"):
        kube_protobuf.decode(pod)


def test_a_body_without_the_magic_is_refused() -> None:
    with pytest.raises(kube_protobuf.ProtobufBodyError, match="magic"):
        kube_protobuf.decode(b"\x0a\x00")
