/* fuzz_jinja: arbitrary bytes as a chat template through the Jinja engine:
 * compiled, then rendered with a conversation that has tools, a tool call
 * and chat_template_kwargs, under tight limits. A template either fails with
 * a message or renders; it must never crash, hang, leak or pass its limits
 * (output size, steps, depth, memory). Any sanitizer report is a finding. */
#include "jinja/kg_jinja.h"
#include "schema/kg_chat.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok) {
    if (!ok) {
        abort();
    }
}

static const char vars[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\","
    " \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"arguments\": {\"city\": \"Paris\"}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"21C\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
    "\"string\"}}}}}],"
    " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true,"
    " \"enable_thinking\": false, \"reasoning_effort\": \"low\", \"n\": 3, \"x\": 1.5}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[256] = "";
    kg_jinja_template_t *t = kg_jinja_compile((const char *)data, size, err, sizeof(err));
    if (!t) {
        check(err[0] != '\0');
        return 0;
    }
    kg_jinja_limits_t lim = {.max_output_bytes = 1 << 16,
                             .max_memory_bytes = 8 << 20,
                             .max_steps = 20000,
                             .max_depth = 20};
    kg_jinja_ctx_t *ctx = kg_jinja_ctx_new(&lim);
    check(ctx != NULL);
    kg_jinja_ctx_set_time(ctx, 1700000000);
    check(kg_chat_jinja_set_json(ctx, vars, strlen(vars), err, sizeof(err)) == KG_OK);
    char *out = NULL;
    size_t len = 0;
    kg_status_t st = kg_jinja_render(t, ctx, &out, &len, err, sizeof(err));
    if (st == KG_OK) {
        check(out != NULL && len <= lim.max_output_bytes && out[len] == '\0');
    } else {
        check(out == NULL && (st == KG_ERR_NOMEM || err[0] != '\0'));
    }
    free(out);
    kg_jinja_ctx_free(ctx);
    kg_jinja_template_free(t);
    return 0;
}
