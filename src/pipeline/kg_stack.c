/* kg_stack: the engine stack, built in order and freed in reverse (see
 * kg_stack.h). */
#include "kg_stack.h"

#include "../engine/kg_backend_registry.h"
#include "../schema/kg_chat.h"

#include <stdio.h>
#include <stdlib.h>

struct kg_stack {
    kg_engine_params_t ep;
    bool ctx_clamped;
    kg_grammar_cache_t *grammars; /* NULL without one */
    kg_backend_t *be;
    kg_engine_t *engine;
    kg_runner_t *runner;   /* NULL without one, or after kg_stack_stop */
    kg_chat_jinja_t *chat; /* the model's chat template compiled; NULL: none usable */
    kg_loras_t loras;      /* the served LoRA adapters */
};

kg_stack_options_t kg_stack_options_default(void) {
    kg_stack_options_t o = {.backend = "auto", .engine = kg_engine_options_default()};
    return o;
}

kg_stack_t *kg_stack_new(const kg_model_t *model,
                         const kg_stack_options_t *o,
                         char *errstr,
                         size_t errstr_size) {
    kg_stack_t *stack = calloc(1, sizeof(*stack));
    if (!stack) {
        snprintf(errstr, errstr_size, "out of memory");
        return NULL;
    }
    kg_backend_params_t bp;
    if (kg_engine_size(model, &o->engine, &stack->ep, &bp, &stack->ctx_clamped, errstr,
                       errstr_size) != KG_OK) {
        goto fail;
    }
    stack->ep.no_jump_forward = o->no_jump_forward;
    if (o->grammar_bytes > 0) {
        /* constrained jobs compile on the caller's thread, once per schema */
        stack->grammars = kg_grammar_cache_new_for(model->tok, o->grammar_bytes);
        if (!stack->grammars) {
            snprintf(errstr, errstr_size, "out of memory for the grammar cache");
            goto fail;
        }
    }
    if (kg_loras_parse(&stack->loras, o->lora, errstr, errstr_size) != KG_OK ||
        kg_loras_set_dir(&stack->loras, o->lora_dir, errstr, errstr_size) != KG_OK) {
        goto fail;
    }
    /* compiled once here; a template that does not compile logs why */
    stack->chat = kg_chat_jinja_compile(model->chat_template);
    stack->be = kg_backend_new(o->backend, model, &bp, errstr, errstr_size);
    if (!stack->be) {
        goto fail;
    }
    /* before the runner: the backend takes adapters only between steps */
    if (kg_loras_load(&stack->loras, model, stack->be, o->max_loras, errstr, errstr_size) !=
        KG_OK) {
        goto fail;
    }
    stack->engine = kg_engine_new(stack->be, &stack->ep, errstr, errstr_size);
    if (!stack->engine) {
        goto fail;
    }
    kg_engine_set_adapters(stack->engine, stack->loras.adapters);
    if (o->runner_inflight > 0) {
        stack->runner = kg_runner_new(stack->engine, o->runner_inflight, errstr, errstr_size);
        if (!stack->runner) {
            goto fail;
        }
    }
    return stack;
fail:
    kg_stack_free(stack);
    return NULL;
}

void kg_stack_stop(kg_stack_t *stack) {
    kg_runner_free(stack->runner); /* joins the engine thread */
    stack->runner = NULL;
}

void kg_stack_free(kg_stack_t *stack) {
    if (!stack) {
        return;
    }
    kg_stack_stop(stack);
    kg_engine_free(stack->engine);
    kg_loras_clear(&stack->loras);
    kg_backend_free(stack->be);
    kg_grammar_cache_free(stack->grammars);
    kg_chat_jinja_free(stack->chat);
    free(stack);
}

kg_engine_t *kg_stack_engine(const kg_stack_t *stack) {
    return stack->engine;
}

kg_backend_t *kg_stack_backend(const kg_stack_t *stack) {
    return stack->be;
}

kg_loras_t *kg_stack_loras(kg_stack_t *stack) {
    return &stack->loras;
}

kg_runner_t *kg_stack_runner(const kg_stack_t *stack) {
    return stack->runner;
}

kg_grammar_cache_t *kg_stack_grammars(const kg_stack_t *stack) {
    return stack->grammars;
}

const kg_chat_jinja_t *kg_stack_chat_template(const kg_stack_t *stack) {
    return stack->chat;
}

const kg_engine_params_t *kg_stack_params(const kg_stack_t *stack) {
    return &stack->ep;
}

bool kg_stack_ctx_clamped(const kg_stack_t *stack) {
    return stack->ctx_clamped;
}

const char *kg_stack_backend_name(const kg_stack_t *stack) {
    return kg_backend_name(stack->be);
}

void kg_stack_backend_counters(const kg_stack_t *stack, kg_backend_counters_t *out) {
    kg_backend_counters(stack->be, out);
}
