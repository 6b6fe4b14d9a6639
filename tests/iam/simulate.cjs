// Evaluates IAM requests against policies with @cloud-copilot/iam-simulate (pinned in the
// Makefile's NODE_PINS): AWS's evaluation logic (explicit Deny first, then Allow; Action,
// Resource and NotAction/NotResource with wildcards; every condition operator and the
// ForAllValues/ForAnyValue set operators), not ours. Reads [{policies, request}] as JSON on
// stdin, where a request is {action, resource, context}; writes one result per case:
// "Allowed", "ExplicitlyDenied", "ImplicitlyDenied", or "error: ..." when the simulator
// finds the request or a policy invalid (an unknown action, a condition key the action
// does not take).
const { runSimulation } = require('@cloud-copilot/iam-simulate');

const ACCOUNT = '123456789012';

async function main() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const cases = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  const results = [];
  for (const { policies, request } of cases) {
    const simulation = {
      identityPolicies: policies.map((policy, i) => ({ name: `policy${i}`, policy })),
      serviceControlPolicies: [],
      resourceControlPolicies: [],
      request: {
        principal: `arn:aws:iam::${ACCOUNT}:role/function`,
        action: request.action,
        resource: { resource: request.resource, accountId: ACCOUNT },
        contextVariables: request.context,
      },
    };
    const response = await runSimulation(simulation, {});
    results.push(response.resultType === 'error' ? `error: ${JSON.stringify(response.errors)}` : response.overallResult);
  }
  process.stdout.write(JSON.stringify(results));
}

main().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err));
  process.exit(1);
});
