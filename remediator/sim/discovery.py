"""Discovery endpoints: /version, /api, /apis and the per group-version resource lists."""

from __future__ import annotations

from aiohttp import web

from remediator.sim import api, resources


async def version(request: web.Request) -> web.Response:
    return api.json_response(resources.VERSION_INFO)


async def core_versions(request: web.Request) -> web.Response:
    return api.json_response(resources.api_versions(request.host))


async def group_list(request: web.Request) -> web.Response:
    return api.json_response(resources.api_group_list())


async def group(request: web.Request) -> web.Response:
    name = request.match_info["group"]
    if name not in resources.GROUP_VERSIONS:
        raise api.not_found_path()
    return api.json_response({"kind": "APIGroup", "apiVersion": "v1", **resources.api_group(name)})


async def resource_list(request: web.Request) -> web.Response:
    info = request.match_info
    body = resources.resource_list(info.get("group", ""), info["version"])
    if body is None:
        raise api.not_found_path()
    return api.json_response(body)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def openapi_v2(request: web.Request) -> web.Response:
    """An empty OpenAPI v2 document: kubectl then skips client-side schema validation.

    kubectl asks for the protobuf encoding; an empty protobuf message is a valid empty
    ``openapi_v2.Document``. /openapi/v3 stays 404, which makes kubectl fall back to v2.
    """
    if "protobuf" in request.headers.get("Accept", ""):
        return web.Response(body=b"", content_type="application/octet-stream")
    version = resources.VERSION_INFO["gitVersion"]
    return api.json_response(
        {
            "swagger": "2.0",
            "info": {"title": "Kubernetes", "version": version},
            "paths": {},
            "definitions": {},
        }
    )
