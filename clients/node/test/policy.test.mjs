// The default ban policy: the same table as the Python client's.
import assert from "node:assert/strict";
import { test } from "node:test";

import { classify } from "../dist/index.js";

const cases = [
  [200, {}, "<html>products</html>", "ok"],
  [404, {}, "not here", "ok"],
  [500, {}, "oops", "ok"],
  [429, {}, "", "rate_limited"],
  [503, { "Retry-After": "30" }, "", "rate_limited"],
  [503, {}, "<div class='g-recaptcha'>", "blocked"],
  [403, {}, "Forbidden", "blocked"],
  [200, {}, "<title>Are you a robot?</title>", "blocked"],
  [200, {}, "x".repeat(70000) + "captcha", "ok"],
  [503, { "X-Squid-Error": "ERR_CONNECT_FAIL 111" }, "", "error"],
  [403, { "x-squid-error": "ERR_ACCESS_DENIED 0" }, "", "error"],
];

for (const [status, headers, body, want] of cases) {
  test(`${status} ${JSON.stringify(headers)} ${body.slice(0, 30)} -> ${want}`, () => {
    assert.equal(classify(status, headers, body), want);
    assert.equal(classify(status, new Headers(headers), Buffer.from(body)), want, "fetch's Headers and bytes too");
  });
}
