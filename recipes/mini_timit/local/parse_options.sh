# Options of the recipe's scripts, in Kaldi's convention: sourced after a script's configuration section
# and its usage() function, it turns "--some-name VALUE" into some_name=VALUE for every variable that the
# configuration section declares, calls usage() for --help, -h or an option it does not declare, and
# stops at the first argument that is not an option (the script's positional arguments stay in "$@").
# bash only (printf -v); the script checks the values itself.

while [ $# -gt 0 ]; do
  case "$1" in
    --help|-h) usage ;;
    --*)
      option_name=${1#--}
      option_name=${option_name//-/_}
      if [[ ! $option_name =~ ^[a-z][a-z0-9_]*$ ]] || ! declare -p "$option_name" >/dev/null 2>&1; then
        echo "$0: Error: unknown option $1" >&2
        usage
      fi
      if [ $# -lt 2 ]; then
        echo "$0: Error: option $1 needs a value" >&2
        usage
      fi
      printf -v "$option_name" '%s' "$2"
      shift 2 ;;
    *) break ;;
  esac
done
unset option_name
