"""What the docs state about the template, checked against template.yaml:
the bookkeeping grants docs/storage.md lists are exactly the ones each
function's role holds under `dynamodb:LeadingKeys = "-2"`."""

import re
from pathlib import Path

from samtranslator.yaml_helper import yaml_parse

ROOT = Path(__file__).resolve().parent.parent


def bookkeeping_grants(template: dict) -> dict:
    """Function (`PumpFunction` → `pump`) → the DynamoDB actions its role may
    use on the event table's bookkeeping partition (slot -2) only."""
    grants = {}
    for name, resource in template["Resources"].items():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        for policy in resource.get("Properties", {}).get("Policies", []):
            for statement in policy.get("Statement", []) if isinstance(policy, dict) else []:
                keys = statement.get("Condition", {}).get("ForAllValues:StringEquals", {})
                if keys.get("dynamodb:LeadingKeys") == ["-2"] and statement.get("Effect") == "Allow":
                    actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                    function = name.removesuffix("Function").lower()
                    grants.setdefault(function, set()).update(a.removeprefix("dynamodb:") for a in actions)
    return grants


def documented_grants(page: Path) -> dict:
    """The table under "The roles reach this partition" in docs/storage.md:
    `| function | `Action`, `Action` |` rows."""
    text = page.read_text().split("The roles reach this partition", 1)[1]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \|", text, re.M)
    return {function: set(re.findall(r"`(\w+)`", actions)) for function, actions in rows}


def test_the_grants_are_read_from_a_role_and_a_row():
    template = {"Resources": {"PumpFunction": {"Type": "AWS::Serverless::Function", "Properties": {"Policies": [
        {"Statement": [
            {"Effect": "Allow", "Action": ["dynamodb:GetItem"], "Condition": {
                "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["-2"]}}},
            {"Effect": "Allow", "Action": ["dynamodb:PutItem"], "Condition": {
                "ForAllValues:StringEquals": {"dynamodb:LeadingKeys": ["-1"]}}},
        ]}]}}}}
    assert bookkeeping_grants(template) == {"pump": {"GetItem"}}


def test_storage_md_lists_each_roles_bookkeeping_grants_as_the_template_grants_them():
    template = yaml_parse((ROOT / "template.yaml").read_text())
    granted = bookkeeping_grants(template)
    documented = documented_grants(ROOT / "docs" / "storage.md")
    assert granted, "the parser finds the template's grants"
    assert documented == granted, f"docs/storage.md says {documented}, the template grants {granted}"
