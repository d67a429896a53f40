"""vLLM's OpenAI-compatible HTTP surface over the simulated engine."""

import asyncio
import hashlib
import json
import logging
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, model_validator
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from vllm._sim.engine import Engine, EngineDeadError, RequestError

log = logging.getLogger("vllm")


@dataclass
class ServingState:
    """What the routes share: the engine, served names, and whether weights finished loading."""

    engine: Engine
    served_model_names: list[str]
    model_path: str
    version: str
    ready: bool = False
    # vLLM makes a tool parser only with --enable-auto-tool-choice (its name then from --tool-call-parser)
    tool_parser: str | None = None
    load_task: asyncio.Task | None = field(default=None, repr=False)  # held so the task is not garbage-collected
    # launcher.py terminate_if_errored: the API server stops once its engine is dead (server.py sets it)
    terminate_if_errored: Callable[[], None] = field(default=lambda: None, repr=False)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    @property
    def release(self) -> tuple[int, int]:
        """0.18.0rc1 -> (0, 18): what the engine-error answers below depend on."""
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)


class StreamOptions(BaseModel):
    include_usage: bool = False


class GenerationRequest(BaseModel):
    """Fields both completion endpoints share; vLLM accepts (and ignores) fields it does not know."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    n: int = 1


class CompletionRequest(GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's legacy default


class ChatRequest(GenerationRequest):
    messages: list[dict]
    max_completion_tokens: int | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None

    @model_validator(mode="before")
    @classmethod
    def _tools_choose_auto(cls, data):
        """check_tool_usage: tools without tool_choice mean "auto"."""
        if isinstance(data, dict) and "tool_choice" not in data and data.get("tools"):
            data = {**data, "tool_choice": "auto"}
        return data


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    prompt: str | None = None
    messages: list[dict] | None = None


def error_response(status: int, kind: str, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status
    )


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class CompletionShape:
    """Bodies of /v1/completions."""

    object_name = "text_completion"
    id_prefix = "cmpl"
    generator_name = "completion"  # as the serving class's error log names its stream generator

    def first_chunks(self) -> list[dict]:
        return []

    def chunk_choice(self, text: str, finish_reason: str | None) -> dict:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason, "stop_reason": None}

    def full_choice(self, text: str, finish_reason: str) -> dict:
        return self.chunk_choice(text, finish_reason)


class ChatShape:
    """Bodies of /v1/chat/completions."""

    object_name = "chat.completion"
    id_prefix = "chatcmpl"
    generator_name = "chat completion"

    def first_chunks(self) -> list[dict]:
        return [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]

    def chunk_choice(self, text: str, finish_reason: str | None) -> dict:
        return {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish_reason}

    def full_choice(self, text: str, finish_reason: str) -> dict:
        return {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }


@dataclass(frozen=True)
class Job:
    """One accepted request: who answers, with what, and in which body shape."""

    shape: CompletionShape | ChatShape
    model: str
    prompt_ids: list[int]
    max_tokens: int
    ignore_eos: bool
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def body(self, choices: list[dict], chunk: bool, **extra) -> dict:
        kind = self.shape.object_name + (".chunk" if chunk and isinstance(self.shape, ChatShape) else "")
        return {
            "id": f"{self.shape.id_prefix}-{self.request_id}",
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


def stream_error(err: EngineDeadError, release: tuple[int, int]) -> dict:
    """The event vLLM's stream generators send for an error: 0.18.0 passes the exception to
    create_streaming_error_response, which makes it a 500; 0.11.0 and 0.13.0 pass str(e), which takes the
    function's defaults, BadRequestError and 400 (serving_chat.py, serving_completion.py)."""
    kind, code = ("InternalServerError", 500) if release >= (0, 18) else ("BadRequestError", 400)
    return {"error": {"message": str(err), "type": kind, "param": None, "code": code}}


async def stream_job(engine: Engine, job: Job, include_usage: bool, release: tuple[int, int]) -> AsyncIterator[str]:
    """OpenAI server-sent events: content chunks, the usage chunk when asked for, then [DONE]. An aborted
    request's last chunk has no text and finish_reason "abort" (the 200 stands, [DONE] follows), unless it
    had no token yet: the stream generators send no empty chunk then (serving_chat.py, serving_completion.py:
    "Chunked prefill case, don't return empty chunks"), so the stream ends with nothing more than [DONE]."""
    for choice in job.shape.first_chunks():
        yield sse(job.body([choice], chunk=True))
    produced = 0
    try:
        async for event in engine.generate(job.prompt_ids, job.max_tokens, job.ignore_eos, job.request_id):
            if not event.token and produced == 0:
                continue
            produced += event.token
            yield sse(job.body([job.shape.chunk_choice(event.text, event.finish_reason)], chunk=True))
    except EngineDeadError as err:
        # the 200 is sent: the error is the next event, then [DONE]; the server's watchdog stops it later
        log.error("Error in %s stream generator.", job.shape.generator_name)
        yield sse(stream_error(err, release))
        yield sse("[DONE]")
        return
    if include_usage:
        yield sse(job.body([], chunk=True, usage=usage(len(job.prompt_ids), produced)))
    yield sse("[DONE]")


async def complete_job(engine: Engine, job: Job) -> dict:
    """The whole answer; an aborted request's is its text so far with finish_reason "abort" (the full
    generator raises only for "error": serving_chat.py chat_completion_full_generator, _raise_if_error)."""
    text, produced, finish_reason = "", 0, "length"
    async for event in engine.generate(job.prompt_ids, job.max_tokens, job.ignore_eos, job.request_id):
        text, produced, finish_reason = text + event.text, produced + event.token, event.finish_reason or finish_reason
    return job.body(
        [job.shape.full_choice(text, finish_reason)], chunk=False, usage=usage(len(job.prompt_ids), produced)
    )


def completion_prompt_ids(engine: Engine, prompt) -> list[int]:
    """One prompt per request: a string, token ids, or a list holding exactly one of those."""
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise RequestError("the simulated server takes one prompt per request")
        prompt = prompt[0]
    return list(prompt) if isinstance(prompt, list) else engine.codec.encode(prompt)


class AuthenticationMiddleware:
    """vLLM's API key check: every /v1 request needs `Authorization: Bearer <one of the keys>`,
    else 401 {"error": "Unauthorized"}; OPTIONS and other paths (/health, /metrics) stay open."""

    def __init__(self, app: ASGIApp, tokens: list[str]) -> None:
        self.app = app
        self.token_digests = [hashlib.sha256(token.encode()).digest() for token in tokens]

    def verify(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.encode()).digest()
        return any(secrets.compare_digest(digest, known) for known in self.token_digests)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] not in ("http", "websocket") or scope.get("method") == "OPTIONS"
                or not scope["path"].startswith("/v1") or self.verify(Headers(scope=scope))):
            return await self.app(scope, receive, send)
        await JSONResponse(content={"error": "Unauthorized"}, status_code=401)(scope, receive, send)


def create_app(state: ServingState, load: Callable[[], Awaitable[None]], api_keys: list[str] | None = None) -> FastAPI:
    """The FastAPI app; `load` runs at start-up and /health turns 200 once it is done.
    With `api_keys`, /v1 requests must carry one of them as a Bearer token."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        state.load_task = asyncio.create_task(load())
        yield

    app = FastAPI(lifespan=lifespan)
    if api_keys:
        app.add_middleware(AuthenticationMiddleware, tokens=api_keys)
    engine = state.engine

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError):
        return error_response(400, "BadRequestError", str(exc.errors()))

    @app.exception_handler(RequestError)
    async def request_error(_request: Request, exc: RequestError):
        return error_response(400, "BadRequestError", str(exc))

    @app.exception_handler(EngineDeadError)
    async def engine_dead(_request: Request, exc: EngineDeadError):
        """terminate_if_errored, then 500: 0.18.0's engine_error_handler (openai/server_utils.py) answers with
        the error's message; 0.11.0's and 0.13.0's runtime_exception_handler (launcher.py) with no body."""
        state.terminate_if_errored()
        if state.release >= (0, 18):
            return error_response(500, "InternalServerError", str(exc))
        return Response(status_code=500)

    def refusal(model: str | None) -> JSONResponse | None:
        """503 while loading, 404 for a model this server does not serve."""
        if not state.ready:
            return error_response(503, "ServiceUnavailableError", "The model is still loading.")
        if model is not None and model not in state.served_model_names:
            return error_response(404, "NotFoundError", f"The model `{model}` does not exist.", "model")
        return None

    def generation_refusal(model: str | None) -> JSONResponse | None:
        """refusal, then the serving classes' check of the engine (`if engine_client.errored: raise dead_error`,
        after the model's): EngineDeadError, before a stream's 200 is sent."""
        if (refused := refusal(model)) is not None:
            return refused
        engine.check_alive()
        return None

    async def answer(job: Job, request: GenerationRequest):
        if request.n != 1:
            raise RequestError("the simulated server supports n=1 only")
        engine.check_length(len(job.prompt_ids), job.max_tokens)
        if request.stream:
            include_usage = bool(request.stream_options and request.stream_options.include_usage)
            return StreamingResponse(stream_job(engine, job, include_usage, state.release),
                                     media_type="text/event-stream")
        return JSONResponse(await complete_job(engine, job))

    @app.get("/health")
    async def health():
        """200 once loaded; 503 once the engine is dead (check_health raises EngineDeadError), until the server
        stops (serve/instrumentator/health.py in 0.18.0, api_server.py in 0.11.0)."""
        return Response(status_code=200 if state.ready and not engine.dead else 503)

    @app.get("/version")
    async def version():
        return {"version": state.version}

    @app.get("/v1/models")
    async def models():
        cards = [
            {
                "id": name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": state.model_path,
                "parent": None,
                "max_model_len": engine.capacity.max_model_len,
            }
            for name in state.served_model_names
        ]
        return {"object": "list", "data": cards}

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest):
        if (refused := generation_refusal(request.model)) is not None:
            return refused
        prompt_ids = completion_prompt_ids(engine, request.prompt)
        job = Job(CompletionShape(), state.model_name, prompt_ids, request.max_tokens or 16, request.ignore_eos)
        return await answer(job, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatRequest):
        if (refused := generation_refusal(request.model)) is not None:
            return refused
        if request.tool_choice == "auto" and state.tool_parser is None:
            # render_chat_request (vllm/entrypoints/serve/render/serving.py); the simulated model calls no tools
            return error_response(400, "BadRequestError", '"auto" tool choice requires --enable-auto-tool-choice '
                                  "and --tool-call-parser to be set")
        prompt_ids = engine.codec.encode(engine.codec.chat_prompt(request.messages))
        max_tokens = (
            request.max_completion_tokens or request.max_tokens or engine.capacity.max_model_len - len(prompt_ids)
        )
        job = Job(ChatShape(), state.model_name, prompt_ids, max_tokens, request.ignore_eos)
        return await answer(job, request)

    if state.release >= (0, 18):
        @app.post("/v1/chat/completions/render")
        async def render_chat_completion(request: ChatRequest):
            """0.18.0's render API (vllm/entrypoints/serve/render/api_router.py, render_chat_request): the
            request's prompt ids, as GenerateRequest; vllm-router's cache_aware policy asks it of every
            worker. Of GenerateRequest's fields, sampling_params is cut to max_tokens."""
            if (refused := refusal(request.model)) is not None:
                return refused
            prompt_ids = engine.codec.encode(engine.codec.chat_prompt(request.messages))
            return {"request_id": f"chatcmpl-{uuid.uuid4().hex}", "token_ids": prompt_ids, "features": None,
                    "sampling_params": {"max_tokens": request.max_completion_tokens or request.max_tokens},
                    "model": request.model, "stream": bool(request.stream), "stream_options": None,
                    "cache_salt": None}

    @app.post("/tokenize")
    async def tokenize(request: TokenizeRequest):
        if (refused := refusal(request.model)) is not None:
            return refused
        text = engine.codec.chat_prompt(request.messages) if request.messages is not None else request.prompt or ""
        tokens = engine.codec.encode(text)
        return {
            "count": len(tokens),
            "max_model_len": engine.capacity.max_model_len,
            "tokens": tokens,
            "token_strs": None,
        }

    @app.get("/metrics")
    async def metrics():
        return Response(generate_latest(engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
