#!/usr/bin/env python3
"""Writes python_re.tsv: pattern, name, and what Python's re.match and
fnmatch.fnmatchcase say, for pyre's tests. Run from this folder:
    python3 make_cases.py > python_re.tsv
Each line: kind (re/glob), pattern, input, result (1, 0, or "error").
Tabs and newlines in fields are written as \\t and \\n."""
import fnmatch, re, sys

names = [
    "model.layers.3.mlp.experts.17.gate_proj",
    "model.layers.3.mlp.shared_experts.gate_proj",
    "model.layers.3.mlp.gate_proj",
    "model.layers.0.mlp.down_proj",
    "model.layers.12.self_attn.q_a_proj",
    "model.layers.3.mlp.gate",
    "lm_head",
    "language_model.model.layers.1.mlp.experts.0.up_proj",
    "model.layers.3.mlp.experts",
    "",
    "a\n",
    "ab\nc",
    "Model.Layers.3.MLP",
    "x" * 60,
    "aaa",
    "über.straße",
]
res = [
    r".*self_attn.*", r".*shared_experts.*", r".*mlp\.(gate|up|gate_up|down)_proj.*",
    r".*mlp\.(?!experts)(gate|up|down)_proj.*", r"lm_head", r"model\.layers\.[0-2]\.",
    r".*(?<=mlp\.)gate$", r".*(?<!shared_)experts\..*", r"(?i)model\.LAYERS", r"(?i:MODEL)\.layers",
    r"a$", r"a\Z", r"ab$", r"(?m)ab$", r"(?s)ab.c", r"ab.c", r"\bmlp\b", r".*\bmlp\b", r".*\Bayers",
    r"x{60}", r"x{61}", r"x{0,}y?", r"(?:x{2,3})+$", r"(?:x{2,3}?)+?$", r"(?>x*)x", r"x*+x", r"x*x",
    r"(?:)*", r"(?:a|){3,5}$", r"(a|b)*?c", r"[^.]+\.layers", r"[\w.]+$", r"[a-z.]+$",
    r"\d+", r".*\d+\.mlp", r".*\.\d{2}\.", r"\w+\.\W", r".*\s", r"\S+$", r"[]a]", r"[^]a]", r"a{,2}$",
    r"a{2,1}", r"a**", r"*a", r"(?P<n>model)\.", r"(?P=n)", r"(?#comment)model", r"model(?=\.layers)",
    r"(?x) model \. layers # comment", r".*(?<=[0-9])\.mlp", r".*(?<=a|bc)x", r"\x6dodel", r"\u006dodel", r"\q",
    r"a{", r"a{1,", r"a{x}", r"[a-", r"(", r")", r"a|", r"|", r"(?i)über", r"(?i)ÜBER", r".*STRASSE",
    r".*stra(ß|ss)e", r"(?a)\w+\.", r"\w+\.", r"^model", r"(?:^|\.)layers", r".*(?:^|\.)layers",
    r"(?=.*experts)(?!.*shared).*gate_proj", r"(?<=\.)layers", r"[\d]+", r"[\D]", r"[\s\S]*", r"a\Z|b",
    r"(a)|b", r"(?s:.)", r".{1000}" * 3 + "NNN", r"(?:.{1000}){1000}",
]
globs = [
    "lm_head", "model.layers.*.self_attn*", "*.mlp.gate", "*mlp.experts*", "model.layers.?.mlp.gate_proj",
    "model.layers.[0-2].mlp.*", "model.layers.[!0-2].mlp.*", "[]a]*", "[!]a]*", "[a-", "*", "", "**",
    "*.*.*.*.*.*.*.*.*.*.*.*.*.*.*x", "re:.*self_attn.*", "re:.{1000}NNN", "*[", "x*", "*x", "?*?",
    "model.layers.3.mlp.experts", "model.layers.3.mlp.experts*", "*experts.1?.*",
]

def esc(s):
    return s.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")

for p in res:
    for n in names:
        try:
            r = "1" if re.match(p, n) else "0"
        except re.error:
            r = "error"
        except OverflowError:
            r = "error"
        print("re", esc(p), esc(n), r, sep="\t")
for p in globs:
    for n in names:
        print("glob", esc(p), esc(n), "1" if fnmatch.fnmatchcase(n, p) else "0", sep="\t")
