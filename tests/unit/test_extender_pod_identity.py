"""``pod_identity`` (the watch's cheap read of a pod's UID and key) agrees with ``pod_record``."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from scheduler_ext.cluster.objects import pod_identity, pod_record

_maybe_text = st.one_of(st.none(), st.just(""), st.text(max_size=12))


@given(uid=_maybe_text, namespace=_maybe_text, name=_maybe_text)
def test_uid_and_key_are_the_records_for_any_metadata(uid: Any, namespace: Any, name: Any) -> None:
    metadata = {k: v for k, v in (("uid", uid), ("namespace", namespace), ("name", name)) if v is not None}
    pod = {"metadata": metadata, "spec": {}}
    record = pod_record(pod)
    assert pod_identity(pod) == (record.uid, record.key)


def test_a_pod_without_a_uid_is_named_by_namespace_and_name() -> None:
    assert pod_identity({"metadata": {"namespace": "ml", "name": "train-0"}}) == ("ml/train-0", "ml/train-0")
    assert pod_identity({"metadata": {"uid": "u-1", "name": "p"}}) == ("u-1", "default/p")
