"""Handlers: a signature turned into a pydantic parameter model, and running one into (result, error)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any, Literal, get_type_hints

import structlog
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, create_model

from qbroker.context import RequestContext
from qbroker.errors import (
    Cleared,
    ErrorInfo,
    HandlerCrashed,
    HandlerTimeout,
    InvalidParams,
    QBrokerError,
    Warn,
    native_error,
)

Extra = Literal["forbid", "ignore"]
Dispatch = Callable[[Any, RequestContext], Awaitable[Any]]


def describe_validation_error(exc: ValidationError) -> str:
    """``field: problem; field: problem`` in a stable order, so one bad request gives one message."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


class Handler:
    """A registered callable plus the model that validates its parameters."""

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str,
        *,
        extra: Extra = "forbid",
        executor: Executor | None = None,
        request: type[BaseModel] | None = None,
    ) -> None:
        self.fn = fn
        self.name = name
        # A plain ``def`` handler may block (time.sleep, a DB driver): it runs in the unit's bounded
        # thread pool, so the event loop, the AMQP heartbeats and the handler timeout keep going.
        self.sync = not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__))
        self.executor = executor
        hints = get_type_hints(fn)
        self.context_param: str | None = None
        fields: dict[str, Any] = {}
        for param in inspect.signature(fn).parameters.values():
            annotation = hints.get(param.name, Any)
            if annotation is RequestContext:
                self.context_param = param.name
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"handler {fn.__qualname__}: *args/**kwargs are not supported")
            default = ... if param.default is param.empty else param.default
            fields[param.name] = (annotation, default)
        if request is not None:
            # The request model named at registration, not the parameter's annotation: one function can
            # serve several commands, each validated against its own model.
            if len(fields) != 1:
                raise TypeError(
                    f"handler {fn.__qualname__}: request= needs exactly one parameter besides the RequestContext one"
                )
            pname, (_, default) = next(iter(fields.items()))
            fields[pname] = (request, default)
        self.param_names = list(fields)
        # The whole body goes to a parameter named ``body`` (other parameters keep their defaults),
        # or to a single parameter annotated with a pydantic model.
        self.whole_body: TypeAdapter[Any] | None = None
        self.whole_body_param = ""
        if "body" in fields:
            self.whole_body_param = "body"
        elif len(fields) == 1:
            pname, (annotation, _) = next(iter(fields.items()))
            if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
                self.whole_body_param = pname
        if self.whole_body_param:
            self.whole_body = TypeAdapter(fields[self.whole_body_param][0])
        self.model: type[BaseModel] = create_model(  # type: ignore[call-overload]
            f"{name}.params", __config__=ConfigDict(extra=extra), **fields
        )

    def json_schema(self) -> dict[str, Any]:
        if self.whole_body is not None:
            return self.whole_body.json_schema()
        return self.model.model_json_schema()

    def result_schema(self) -> dict[str, Any]:
        """The JSON schema of what the handler returns, from its return annotation ({} when it has none)."""
        annotation = get_type_hints(self.fn).get("return", Any)
        if annotation is Any or annotation is None or isinstance(annotation, str):
            return {} if annotation is not None else {"type": "null"}
        try:
            return TypeAdapter(annotation).json_schema()
        except Exception:  # a type pydantic cannot describe (a plain class): documented as "anything"
            return {}

    def bind(self, body: Any) -> dict[str, Any]:
        """Keyword arguments for the handler, or InvalidParams naming the offending fields."""
        try:
            if self.whole_body is not None:
                return {self.whole_body_param: self.whole_body.validate_python(body)}
            if body is None:
                body = {}
            if not isinstance(body, dict):
                if len(self.param_names) != 1:
                    raise InvalidParams(
                        f"invalid parameters for {self.name}: expected a JSON object, got {type(body).__name__}"
                    )
                body = {self.param_names[0]: body}
            validated = self.model.model_validate(body)
        except ValidationError as exc:
            raise InvalidParams(f"invalid parameters for {self.name}: {describe_validation_error(exc)}") from exc
        return {name: getattr(validated, name) for name in self.param_names}

    async def call(self, body: Any, ctx: RequestContext) -> Any:
        kwargs = self.bind(body)
        if self.context_param is not None:
            kwargs[self.context_param] = ctx
        if self.sync and self.executor is not None:
            # contextvars (structlog's correlation id) follow the call into the thread.
            run = functools.partial(contextvars.copy_context().run, self.fn, **kwargs)
            result = await asyncio.get_running_loop().run_in_executor(self.executor, run)
        else:
            result = self.fn(**kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result


async def run_handler(
    dispatch: Dispatch, part: str, timeout: float | None, ctx: RequestContext, body: Any
) -> tuple[Any, ErrorInfo | None]:
    """Run a handler and turn whatever happens into (body, error element). Never raises.

    Every log line of the handler carries the correlation id (structlog contextvars). The parameters
    end in (ctx, body), so ``functools.partial(run_handler, dispatch, part, timeout)`` is the innermost
    link of a middleware chain without a frame of its own."""
    # bind/reset by hand: the context-manager form costs more than the rest of this function.
    tokens = structlog.contextvars.bind_contextvars(correlation_id=ctx.header.message_id)
    try:
        return await _run_guarded(dispatch, body, ctx, part, timeout)
    finally:
        structlog.contextvars.reset_contextvars(**tokens)


async def _run_guarded(
    dispatch: Dispatch, body: Any, ctx: RequestContext, part: str, timeout: float | None
) -> tuple[Any, ErrorInfo | None]:
    try:
        if timeout:
            scope = asyncio.timeout(timeout)
            try:
                async with scope:
                    result = await dispatch(body, ctx)
            except TimeoutError:
                if scope.expired():
                    raise HandlerTimeout(f"{part} did not answer within {timeout}s") from None
                raise
        else:
            result = await dispatch(body, ctx)
    except QBrokerError as exc:
        info = exc.to_info(part=part)
        # a debug request's reply includes debugging information (docs/wire-format.md, "Header")
        if ctx.debug and info.trace is None:
            info = info.model_copy(update={"trace": traceback.format_exc()})
        return None, info
    except Exception as exc:
        trace = traceback.format_exc() if ctx.debug else None
        native = native_error(exc, part)
        if native is not None:  # an allowed type: it goes back as itself, with what it said as the detail
            ctx.log.warning("handler raised", error_type=type(exc).__name__, error=native.detail)
            return None, native.model_copy(update={"trace": trace})
        ctx.log.exception("handler raised", error_type=type(exc).__name__)
        return None, HandlerCrashed(f"unhandled {type(exc).__name__} in {part}", trace=trace).to_info(part=part)
    if isinstance(result, Warn | Cleared):
        return result.result, result.to_info(part=part)
    return result, None
