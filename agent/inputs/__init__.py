"""Untrusted text -> documents, with limits: the ONE place every input path decodes.

Role: every datastore document pyfelix reads comes through here before anything else
looks at it: files of the file datastore (and so `pyfelix apply -f`, `pyfelix calc`, confd),
etcd values, Kubernetes API objects, and (exposed for it) the Typha wire. A document that
breaks a limit, repeats a key or cannot be decoded is rejected ALONE, with an `InputError`
naming kind, name, field and limit; callers report it (log + their parse-error metric) and
carry on with the other documents.

API:
- `decode_yaml_documents(text)`, `decode_json_documents(text)`: a file's documents, as
  `Document(index, line, value | error)`; `InputSyntaxError` ends the text.
- `decode_json_document(data, resource=...)`: one stored JSON object (etcd, Typha).
- `decode_json(data, wrapper_depth=...)` + `check_document(obj)`: a transport value holding
  many documents (a Kubernetes list page, a watch event), checked object by object.
- `LIMITS` / `InputLimits`: the limits (README "Input limits"); `agent.model` enforces the
  per-kind ones (rules per policy, selector length) from the same object.

Modules: `limits` (limits, errors), `structure` (the per-document check), `yaml_docs`,
`json_docs`. Imports nothing from the agent but the selector language's nesting limit.
"""

from pyfelix.agent.inputs.json_docs import decode_json, decode_json_document, decode_json_documents
from pyfelix.agent.inputs.limits import LIMITS, InputError, InputLimits, InputSyntaxError
from pyfelix.agent.inputs.structure import Document, InputProblem, check_document, describe
from pyfelix.agent.inputs.yaml_docs import decode_yaml_documents

__all__ = [
    "LIMITS",
    "Document",
    "InputError",
    "InputLimits",
    "InputProblem",
    "InputSyntaxError",
    "check_document",
    "decode_json",
    "decode_json_document",
    "decode_json_documents",
    "decode_yaml_documents",
    "describe",
]
