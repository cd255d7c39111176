"""The plain Ray Serve app the demo's app is compared with: one deployment with Serve's defaults
(max_ongoing_requests, 1 CPU), a Starlette request in, the same numpy forward, a JSON dict out."""

from ray import serve
from starlette.requests import Request


@serve.deployment
class PlainCompletions:
    def __init__(self, checkpoint: str) -> None:
        from addition.inference import Predictor

        self.predictor = Predictor.from_checkpoint(checkpoint)

    async def __call__(self, request: Request) -> dict:
        body = await request.json()
        out = self.predictor.complete([body["prompt"]], max_new_tokens=body.get("max_tokens", 16))
        return {"choices": [{"text": out[0].text}]}


def app_builder(args: dict) -> object:
    return PlainCompletions.bind(args["checkpoint"])
