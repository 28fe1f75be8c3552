/* tandem: the command people type. Dispatches to one subcommand (cli/cmd_*.c):
 * file inspection, tokenizer and model checks, and running the services. */
#include <stdio.h>
#include <string.h>

#include "cli/cmd.h"
#include "common/log.h"

typedef struct cmd_entry {
    const char *name;
    cmd_fn fn;
    const char *help;
} cmd_entry;

static const cmd_entry cmd_table[] = {
    {"serve", cmd_serve, "run the OpenAI-compatible server: kvd, verifyd, draftd and gateway"},
    {"status", cmd_status, "show the services of a running tandem serve and their health"},
    {"restart", cmd_restart, "restart a service of tandem serve (restart draftd --draft DIR)"},
    {"generate", cmd_generate, "generate text in one process (speculative with --draft)"},
    {"logits", cmd_logits, "print the target's top tokens at every position of a token list"},
    {"bench", cmd_bench, "time decode, verify and draft steps on real model shapes (synthetic weights)"},
    {"gguf-info", cmd_gguf_info, "print a GGUF file's metadata and tensor table"},
    {"st-info", cmd_st_info, "print a safetensors file's metadata and tensor table"},
    {"st-write", cmd_st_write, "write a safetensors file from st-info's JSON (with --data)"},
    {"tokenize", cmd_tokenize, "print the token ids of a text (a GGUF file's tokenizer)"},
    {"detokenize", cmd_detokenize, "print the text of token ids"},
    {"chat-template", cmd_chat_template, "render a chat with a model's chat template (Jinja)"},
};

static void tandem_usage(void)
{
    printf("usage: tandem COMMAND [options]   (tandem COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof cmd_table / sizeof cmd_table[0]; i++)
        printf("  %-14s %s\n", cmd_table[i].name, cmd_table[i].help);
}

int main(int argc, char **argv)
{
    log_init("tandem", LOG_LEVEL_INFO);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        tandem_usage();
        return argc < 2 ? 2 : 0;
    }
    for (size_t i = 0; i < sizeof cmd_table / sizeof cmd_table[0]; i++)
        if (!strcmp(argv[1], cmd_table[i].name))
            return cmd_table[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tandem: unknown command '%s'\n", argv[1]);
    tandem_usage();
    return 2;
}
