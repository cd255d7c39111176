"""Operator extra links whose full URL is stored in XCom as soon as the resource name is known.

Storing the URL (not the parts) makes the link work while the task is deferred, after it
failed, and for resources whose address is only known at run time (a local cluster's port).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context
    from airflow.sdk.types import TaskInstanceKey


class StoredUrlLink(BaseOperatorLink):
    name: ClassVar[str]
    key: ClassVar[str]

    @property
    def xcom_key(self) -> str:
        return self.key

    @classmethod
    def persist_url(cls, context: Context, url: str) -> str:
        if url:
            context["ti"].xcom_push(key=cls.key, value=url)
        return url

    @classmethod
    def persist(cls, context: Context, url: str) -> str:
        return cls.persist_url(context, url)

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        value = XCom.get_value(key=self.xcom_key, ti_key=ti_key)
        return value if isinstance(value, str) else ""
