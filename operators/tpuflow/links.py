"""Operator extra links whose full URL is stored in XCom as soon as the resource name is known.

Storing the URL (not the parts) makes the link work while the task is deferred, after it
failed, and for resources whose address is only known at run time (a local cluster's port).
Every link is one ``StoredUrlLink`` subclass: ``format_str`` names the URL's parts, and
``persist(context, **parts)`` formats and stores it (the google provider's link idiom).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context
    from airflow.sdk.types import TaskInstanceKey

CONSOLE = "https://console.cloud.google.com"


class StoredUrlLink(BaseOperatorLink):
    name: ClassVar[str]
    key: ClassVar[str]
    # The URL from the parts given to persist(); "{url}" for links whose URL is known whole.
    format_str: ClassVar[str] = "{url}"

    @property
    def xcom_key(self) -> str:
        return self.key

    @classmethod
    def format_url(cls, **params: Any) -> str:
        return cls.format_str.format(**params)

    @classmethod
    def persist(cls, context: Context, **params: Any) -> str:
        """Format the URL and store it for the task instance; nothing is stored for an empty URL."""
        url = cls.format_url(**params)
        if url:
            context["ti"].xcom_push(key=cls.key, value=url)
        return url

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        value = XCom.get_value(key=self.xcom_key, ti_key=ti_key)
        return value if isinstance(value, str) else ""
