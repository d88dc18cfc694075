"""Generate the PrivateUse1 kernels of the DIOPI operator table (diopi_table.yaml).

Usage: python gen_registration.py TABLE.yaml OUTPUT.cpp

Each table entry becomes one C++ wrapper registered for aten::<op> on PrivateUse1. The wrapper
asks the loaded vendor for the DIOPI function, computes the output shapes with the operator's
Meta kernel, allocates the outputs on the device, converts every argument to its DIOPI form and
calls the vendor; when the vendor lacks the function, declines the call or an argument cannot be
expressed in DIOPI, it runs the CPU fallback instead. Signatures come from torchgen (shipped with
torch), so the wrappers match the dispatcher exactly.
"""
import functools
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from torchgen import local
from torchgen.api.types import DispatcherSignature
from torchgen.model import BaseTy, BaseType, FunctionSchema, ListType, OptionalType


class TableError(Exception):
    pass


@dataclass(frozen=True)
class Kernel:
    wrapper: str  # the C++ function
    registration: str  # its m.impl line
    meta_header: str | None  # the header declaring the at::meta function it calls, if any


def load_schema(aten_name: str) -> FunctionSchema:
    name, _, overload = aten_name.partition(".")
    try:
        schema = torch._C._get_schema(f"aten::{name}", overload)
    except RuntimeError as exc:
        raise TableError(f"aten operator '{aten_name}' does not exist in torch {torch.__version__}") from exc
    text = str(schema).removeprefix("aten::")
    return FunctionSchema.parse(text)


# The table's `meta: shim` takes output shapes from the shim's own shape function,
# dipu::aten::meta::<operator> (csrc/dipu/aten/meta_kernels.h), for operators only non-CPU devices
# reach, whose Meta kernel torch lacks or gets wrong.
SHIM_META = "shim"


def check_registrable(aten_name: str, meta: str | None = None) -> None:
    load_schema(aten_name)
    full = f"aten::{aten_name}"

    def has(key: str) -> bool:
        return torch._C._dispatch_has_kernel_for_dispatch_key(full, key)

    if has("CompositeImplicitAutograd") and not has("CPU"):
        raise TableError(f"'{aten_name}' is CompositeImplicitAutograd: register the operators it decomposes into")
    if meta not in (None, SHIM_META):
        raise TableError(f"meta: '{meta}' is not understood (the only value is '{SHIM_META}')")
    if meta != SHIM_META and not has("Meta"):
        raise TableError(f"'{aten_name}' has no Meta kernel, so its output shapes cannot be computed "
                         f"(write one in csrc/dipu/aten/meta_kernels.h and mark the entry `meta: {SHIM_META}`)")


def is_tensor(ty) -> bool:
    return isinstance(ty, BaseType) and ty.name == BaseTy.Tensor


def is_optional_tensor(ty) -> bool:
    return isinstance(ty, OptionalType) and is_tensor(ty.elem)


def is_tensor_list(ty) -> bool:
    return isinstance(ty, ListType) and is_tensor(ty.elem)


def return_names(schema: FunctionSchema) -> list[str]:
    if schema.name.name.inplace or schema.arguments.out:
        return []
    names = [r.name for r in schema.returns]
    if len(names) == 1 and names[0] is None:
        return ["out"]
    return [name or f"out{i}" for i, name in enumerate(names)]


def diopi_argument(token: str, arguments: dict, outputs: set) -> str:
    if token == "ctx":
        return "call.context()"
    if token in outputs:
        return f"call.output({token})"
    argument = arguments.get(token)
    if argument is None:
        if re.fullmatch(r"[A-Za-z_]\w*", token) and token not in ("true", "false"):
            raise TableError(f"'{token}' is neither an argument nor an output of the operator")
        return token  # a C++ expression written in the table
    ty = argument.type
    if is_tensor(ty):
        return f"call.output({token})" if argument.is_write else f"call.input({token})"
    if is_optional_tensor(ty):
        return f"call.input({token})"
    if is_tensor_list(ty):
        return f"call.inputs({token})"
    text = str(ty)
    if text == "Scalar":
        return f"call.scalar({token})"
    if text == "str":
        return f"call.string({token})"
    if text.startswith("int[") or text.startswith("SymInt["):
        return f"call.size({token})"
    if text == "SymInt":
        return f"{token}.guard_int(__FILE__, __LINE__)"
    if text == "float?":
        return f"call.optional_double({token})"
    if text in ("int", "float", "bool"):
        return token
    raise TableError(f"argument '{token}' of type {text} has no DIOPI conversion")


def split_call(call: str) -> tuple[str, list[str]]:
    match = re.fullmatch(r"\s*(\w+)\s*\((.*)\)\s*", call)
    if not match:
        raise TableError(f"'{call}' is not a call like diopiFoo(ctx, out, self)")
    return match.group(1), [token.strip() for token in match.group(2).split(",")]


def meta_argument(argument) -> str:
    ty = argument.type
    if is_tensor(ty) or is_optional_tensor(ty) or is_tensor_list(ty):
        return f"meta_{argument.name}"
    return argument.name


def meta_function(schema: FunctionSchema, meta: str | None = None) -> tuple[str, str | None]:
    """The C++ Meta kernel (at::meta::...) and its header when torch exports one, else the
    dispatcher's Meta entry, which torch may have replaced with a slower Python registration (or
    or the shim's own shape function, for `meta: shim`)."""
    name = schema.name.name
    if meta == SHIM_META:
        return f"dipu::aten::meta::{schema.name.unambiguous_name()}", None
    header = ops_header(str(name.base))
    function = f"{name.base}_outf" if schema.arguments.out else f"{name.base}{'_' if name.inplace else ''}"
    text = header.read_text() if header.is_file() else ""
    for candidate in (f"{function}_symint", function):
        if candidate in exported_meta_functions() and re.search(rf"\bTORCH_API [^;]*\b{candidate}\(", text):
            return f"at::meta::{candidate}", header.name
    return f"at::_ops::{schema.name.unambiguous_name()}::call", None


@functools.cache
def exported_meta_functions() -> set:
    """Names of the at::meta functions libtorch_cpu defines (a header may declare more)."""
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        listing = subprocess.run(["nm", "-DC", "--defined-only", str(library)], capture_output=True, text=True,
                                 check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return set()
    return set(re.findall(r" at::meta::(\w+)\(", listing))


def ops_header(base: str) -> Path:
    return Path(torch.__file__).parent / "include" / "ATen" / "ops" / f"{base}_meta_dispatch.h"


def result_expression(schema: FunctionSchema, signature: DispatcherSignature, outputs: list) -> str:
    """What the wrapper returns: its fresh outputs, its out= arguments, or self for in-place."""
    returned = outputs or [a.name for a in schema.arguments.out]
    if not returned:
        return schema.arguments.self_arg.argument.name
    if len(returned) == 1:
        return returned[0]
    return f"{signature.returns_type().cpp_type()}({', '.join(returned)})"


def generate_wrapper(entry: dict) -> Kernel:
    aten_name = entry["aten"]
    check_registrable(aten_name, entry.get("meta"))
    schema = load_schema(aten_name)
    signature = DispatcherSignature.from_schema(schema)
    wrapper_name = f"diopi_{schema.name.unambiguous_name()}"
    ops_struct = f"at::_ops::{schema.name.unambiguous_name()}"
    arguments = {a.name: a for a in schema.arguments.flat_all}
    outputs = return_names(schema)
    diopi_name, tokens = split_call(entry["diopi"])
    converted = ", ".join(diopi_argument(t, arguments, set(outputs)) for t in tokens)

    tensor_args = [
        a for a in schema.arguments.flat_all
        if is_tensor(a.type) or is_optional_tensor(a.type) or is_tensor_list(a.type)
    ]
    names = [a.name for a in schema.arguments.flat_all]
    first_tensor = next(a.name for a in tensor_args if not is_optional_tensor(a.type))
    lines = [
        f"// {schema}",
        signature.defn(name=wrapper_name) + " {",
        f'  static dipu::diopi::OpSlot slot("aten::{aten_name}", "{diopi_name}");',
        f"  dipu::diopi::Call call(slot, {first_tensor});",
        f"  auto function = reinterpret_cast<decltype(&::{diopi_name})>(call.function());",
        f"  if (function != nullptr && call.accepts({', '.join(a.name for a in tensor_args)})) {{",
    ]
    for a in tensor_args:
        lines.append(f"    auto meta_{a.name} = dipu::diopi::to_meta({a.name});")
    meta, meta_header = meta_function(schema, entry.get("meta"))
    meta_call = f"{meta}({', '.join(meta_argument(a) for a in schema.arguments.flat_all)})"
    if len(outputs) == 1:
        lines.append(f"    auto {outputs[0]} = call.empty_like({meta_call});")
    elif outputs:
        lines.append(f"    auto meta_result = {meta_call};")
        for i, name in enumerate(outputs):
            lines.append(f"    auto {name} = call.empty_like(std::get<{i}>(meta_result));")
    else:
        lines.append(f"    {meta_call};")
    for a in schema.arguments.out:
        lines.append(f"    call.resize_output({a.name}, meta_{a.name});")
    lines += [
        f"    if (call.finish(function({converted}))) {{",
        f"      return {result_expression(schema, signature, outputs)};",
        "    }",
        "  }",
        f"  return at::native::call_fallback_fn_symint<&dipu::aten::cpu_fallback, {ops_struct}>::call("
        f"{', '.join(names)});",
        "}",
    ]
    registration = f'  m.impl("{aten_name}", TORCH_FN({wrapper_name}));'
    return Kernel("\n".join(lines), registration, meta_header)


def generate(table_path: str) -> str:
    with open(table_path) as f:
        table = yaml.safe_load(f)
    kernels = [generate_entry(table_path, index, entry) for index, entry in enumerate(table)]
    return render(table_path, kernels)


def uses_tensor_list_ref(aten_name: str) -> bool:
    """Structured operators take Tensor[] as ITensorListRef; the generated operator header says which."""
    header = Path(torch.__file__).parent / "include" / "ATen" / "ops" / f"{aten_name.split('.')[0].rstrip('_')}_ops.h"
    return header.is_file() and "ITensorListRef" in header.read_text()


def generate_entry(table_path: str, index: int, entry: dict) -> Kernel:
    try:
        with local.parametrize(use_const_ref_for_mutable_tensors=False,
                               use_ilistref_for_tensor_lists=uses_tensor_list_ref(entry["aten"])):
            return generate_wrapper(entry)
    except (TableError, KeyError, StopIteration) as exc:
        raise SystemExit(f"{table_path}: entry {index} ({entry.get('aten', '?')}): {exc}")


def render(table_path: str, kernels: list) -> str:
    return "\n".join([
        f"// Generated from {table_path.rsplit('/', 1)[-1]} by gen_registration.py. Do not edit.",
        "#include <ATen/Operators.h>",
        *sorted({f"#include <ATen/ops/{k.meta_header}>" for k in kernels if k.meta_header}),
        "#include <ATen/native/CPUFallback.h>",
        "#include <torch/library.h>",
        "",
        "#include <diopi/diopi.h>",
        "",
        '#include "aten/cpu_fallback.h"',
        '#include "aten/diopi_call.h"',
        '#include "aten/meta_kernels.h"',
        "",
        "namespace {",
        "",
        "\n\n".join(k.wrapper for k in kernels),
        "",
        "}  // namespace",
        "",
        "TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {",
        *(k.registration for k in kernels),
        "}",
        "",
    ])


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: gen_registration.py TABLE.yaml OUTPUT.cpp")
    source = generate(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        f.write(source)


if __name__ == "__main__":
    main()
