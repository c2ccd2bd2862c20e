"""A coding agent's side of `/mcp`, through the reference Python MCP client (`mcp`): it
connects over Streamable HTTP, lists the tools, and calls the ones given on the command
line in order. Prints what it saw as JSON for tests/it/mcp.rs to judge.

Usage: mcp_agent.py URL CALLS_JSON, where CALLS_JSON is [[tool, {arguments}], ...];
the bearer token, if any, is in MCP_TOKEN."""

import asyncio
import json
import os
import sys

import jsonschema

from mcp.client.session import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client


def annotations(tool):
    hints = tool.annotations
    if hints is None:
        return None
    return {
        "read_only": hints.read_only_hint,
        "destructive": hints.destructive_hint,
        "idempotent": hints.idempotent_hint,
    }


async def main(url, calls):
    headers = {}
    if os.environ.get("MCP_TOKEN"):
        headers["Authorization"] = f"Bearer {os.environ['MCP_TOKEN']}"
    seen = {"tools": [], "calls": []}
    async with create_mcp_http_client(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                initialized = await session.initialize()
                seen["server"] = initialized.server_info.name
                seen["instructions"] = initialized.instructions
                listed = await session.list_tools()
                for tool in listed.tools:
                    seen["tools"].append(
                        {
                            "name": tool.name,
                            "description": tool.description,
                            "annotations": annotations(tool),
                            "required": tool.input_schema.get("required", []),
                            "output_schema": tool.output_schema is not None,
                        }
                    )
                schemas = {tool.name: tool.output_schema for tool in listed.tools}
                for name, arguments in calls:
                    try:
                        result = await session.call_tool(name, arguments)
                    except Exception as error:  # the protocol's error, as an agent sees it
                        seen["calls"].append({"tool": name, "refused": str(error)})
                        continue
                    text = "".join(
                        block.text for block in result.content if block.type == "text"
                    )
                    call = {
                        "tool": name,
                        "is_error": bool(result.is_error),
                        "json": json.loads(text) if text else None,
                        "structured": result.structured_content,
                    }
                    # A success's structured result is held to the tool's outputSchema
                    # here, whatever the client library checks itself.
                    schema = schemas.get(name)
                    if schema is not None and not result.is_error:
                        try:
                            jsonschema.validate(result.structured_content, schema)
                            call["matches_output_schema"] = True
                        except jsonschema.ValidationError as error:
                            call["matches_output_schema"] = error.message
                    seen["calls"].append(call)
    print(json.dumps(seen))


asyncio.run(main(sys.argv[1], json.loads(sys.argv[2])))
